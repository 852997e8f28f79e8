"""jobledger's tests: a package, so helpers are imported as ``tests.support.*`` (never
from conftest) by the tests and by the processes they start (with the repository root on
PYTHONPATH: see :func:`tests.support.pythonpath`)."""
