"""``python -m jobledger``: the command line, as ``jobledger`` runs it."""

from jobledger.cli import main

main()
