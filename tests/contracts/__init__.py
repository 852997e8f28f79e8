"""One contract per port: an abstract test class stating what the port promises, which
each adapter's test subclasses with a fixture that builds the adapter (the way the
eventsourcing library's own tests/persistence.py states each recorder's promises once
and runs them on every database). The subclasses are in tests/test_contracts.py (and
tests/test_kafka_contracts.py for the adapters that need a broker).

The classes here are not named ``Test*``: pytest collects only the subclasses."""
