"""Reading Prometheus text as the roles expose it (every series also carries job, namespace, role)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` of every sample called ``name`` whose labels include ``labels``."""
    return [(dict(s.labels), s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(text: str, name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with ``labels`` (AssertionError when absent or ambiguous)."""
    found = samples(text, name, **labels)
    assert len(found) == 1, f"metric {name}{labels}: {len(found)} samples"
    return found[0][1]


def names(text: str) -> set[str]:
    """Every sample name in ``text``."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}
