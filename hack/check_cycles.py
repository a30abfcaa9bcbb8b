"""Fails when two sibling modules or packages of the project import each other, directly or through others.

import-linter checks the declared layers; this checks what no layer names: that the import graph
between the children of each package has no cycle (a cycle hidden in function-level imports is still
a cycle). It covers the three installed packages, the cluster launcher ``e2e`` (``e2e.cluster`` and
``e2e.node`` share ``e2e.common`` rather than import each other) and the tests (``tests.support`` is
imported by the test packages and imports none of them).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rft_api", "rft_operator", "rft_runtime", "e2e", "tests")
"""The installed packages, and the two that live at the repository's root (imported from there)."""


def cycles(graph: grimp.ImportGraph, package: str) -> list[tuple[str, str]]:
    children = sorted(graph.find_children(package))
    found = []
    for a, b in itertools.combinations(children, 2):
        if graph.chain_exists(a, b, as_packages=True) and graph.chain_exists(b, a, as_packages=True):
            found.append((a, b))
    return found


def main() -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*PACKAGES)
    parents = sorted(m for m in graph.modules if graph.find_children(m))
    bad = [pair for p in parents for pair in cycles(graph, p)]
    def chain(a: str, b: str) -> str:
        chains = sorted(graph.find_shortest_chains(a, b, as_packages=True))
        return " -> ".join(chains[0]) if chains else "?"

    for a, b in bad:
        print(f"import cycle: {a} <-> {b}\n  {chain(a, b)}\n  {chain(b, a)}")
    print(f"check_cycles: {len(bad)} cycle(s) between sibling packages")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
