"""``python -m jobledger.cli``: the same as the ``jobledger`` console script."""

from jobledger.cli import main

main()
