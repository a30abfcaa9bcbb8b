"""House rule: no function in ``runtime/`` runs over :data:`MAX_LINES` lines.

A function's length is counted from its ``def`` line to the last line of its body (decorators not
counted; a nested function counts toward the function holding it, and on its own).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
MAX_LINES = 80


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method in ``tree``, with its qualified name (``Class.method``, ``outer.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def long_functions(root: Path, limit: int) -> list[str]:
    """``file:line name length`` for each function under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, fn in _functions(tree):
            assert fn.end_lineno is not None
            length = fn.end_lineno - fn.lineno + 1
            if length > limit:
                found.append(f"{path.relative_to(root.parent)}:{fn.lineno} {name} {length}")
    return found


def test_counts_from_def_to_end_of_body(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(4))
    method = body.replace("    ", "        ")
    (tmp_path / "m.py").write_text(f"@decorator\ndef f():\n{body}\n\n\nclass C:\n    def g(self):\n{method}\n")
    assert long_functions(tmp_path, 5) == []
    assert long_functions(tmp_path, 4) == [f"{tmp_path.name}/m.py:2 f 5", f"{tmp_path.name}/m.py:10 C.g 5"]


def test_no_function_in_runtime_over_80_lines() -> None:
    assert RUNTIME.is_dir(), RUNTIME
    found = long_functions(RUNTIME, MAX_LINES)
    assert not found, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(found)
