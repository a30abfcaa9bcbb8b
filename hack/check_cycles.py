"""Fails when two sibling packages of the project import each other, directly or through others.

import-linter checks the declared layers; this checks what no layer names: that the import graph
between the subpackages of each top-level package has no cycle (a cycle hidden in function-level
imports is still a cycle).
"""
from __future__ import annotations

import itertools
import sys

import grimp

PACKAGES = ("rft_api", "rft_operator", "rft_runtime")


def cycles(graph: grimp.ImportGraph, package: str) -> list[tuple[str, str]]:
    children = sorted(graph.find_children(package))
    found = []
    for a, b in itertools.combinations(children, 2):
        if graph.chain_exists(a, b, as_packages=True) and graph.chain_exists(b, a, as_packages=True):
            found.append((a, b))
    return found


def main() -> int:
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
