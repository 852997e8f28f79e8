"""Reading a Prometheus exposition back: samples by name and labels."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of the exposition, keyed by its name and its labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(url: str, **headers: str) -> Samples:
    response = httpx.get(url, headers=headers, timeout=10)
    response.raise_for_status()
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 when there is none (a counter with no series yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """Summed over every series of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}
