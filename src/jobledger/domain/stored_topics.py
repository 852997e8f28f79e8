"""Stored topics: the names rows give their classes, kept when the modules moved.

Every row names its event's class by topic (``jobledger.job:Job.Submitted``), a snapshot
its aggregate's, and a job's first event hashes its aggregate's topic into the chain. The
aggregates moved into ``jobledger.domain``; their topics may not move with them: rows
already written must resolve, and rows written now must be byte for byte what they were.
"""

from __future__ import annotations

import sys

from eventsourcing import utils


def keep_stored_topics(stored_module: str, aggregate: type) -> None:
    """Resolve ``stored_module:…`` topics to ``aggregate``'s module, and write them."""
    utils.register_topic(stored_module, sys.modules[aggregate.__module__])
    for cls in classes_in(aggregate):
        topic = f"{stored_module}:{cls.__qualname__}"
        utils.register_topic(topic, cls)
        # get_topic() reads this cache before it builds a topic from the module path; the
        # library has no public way to name the topic a class is written with.
        utils._type_cache[cls] = topic


def classes_in(cls: type) -> list[type]:
    """The class and every class defined in its body (its events), depth first."""
    nested = [
        v for v in vars(cls).values() if isinstance(v, type) and v.__module__ == cls.__module__
    ]
    return [
        cls,
        *(
            c
            for n in nested
            if n.__qualname__.startswith(cls.__qualname__ + ".")
            for c in classes_in(n)
        ),
    ]
