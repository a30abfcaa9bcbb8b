"""Test harness run inside the sandbox (standalone: stdlib only, copied into the workdir).

It reads ``_rft_spec.json`` (``{"mode": "tests" | "io", "tests": [code, ...]}``), executes
``solution.py``, then each test block in a copy of the solution's namespace, and writes one JSON line
to fd 3::

    {"kind": "result", "status": "syntax_error" | "error" | "completed" | "tests", ...}

Only the original process reports (a forked copy exits silently). The solution runs in this same
process, so a solution written to subvert the harness could forge a result: assertion tests trust the
code not to tamper with the interpreter; ``io`` cases are compared outside the sandbox.
"""

from __future__ import annotations

import json
import os
import sys

MAIN_PID = os.getpid()


def emit(**obj: object) -> None:
    if os.getpid() != MAIN_PID:
        os._exit(1)
    try:
        os.write(3, (json.dumps(obj) + "\n").encode())
    except OSError:
        os._exit(3)


def describe(exc: BaseException) -> dict:
    text = str(exc)
    return {"exc_type": type(exc).__name__, "message": text[:500]}


def main() -> None:
    with open("_rft_spec.json") as fh:
        spec = json.load(fh)
    with open("solution.py") as fh:
        source = fh.read()
    try:
        code = compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        emit(kind="result", status="syntax_error", **describe(exc), line=getattr(exc, "lineno", None))
        return
    io_mode = spec.get("mode") == "io"
    ns: dict = {"__name__": "__main__" if io_mode else "solution", "__builtins__": __builtins__}
    try:
        exec(code, ns)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            emit(kind="result", status="error", stage="solution", exc_type="SystemExit", message=str(exc.code))
            return
    except BaseException as exc:  # noqa: BLE001 - everything is reported
        if isinstance(exc, MemoryError):
            ns.clear()
        emit(kind="result", status="error", stage="solution", **describe(exc))
        return
    if io_mode:
        sys.stdout.flush()
        emit(kind="result", status="completed")
        return
    passed, failures, errors = 0, [], []
    for i, block in enumerate(spec.get("tests", [])):
        try:
            exec(compile(block, f"test_{i}.py", "exec"), dict(ns))
        except AssertionError as exc:
            failures.append({"index": i, "message": str(exc)[:300]})
        except BaseException as exc:  # noqa: BLE001
            errors.append({"index": i, **describe(exc)})
        else:
            passed += 1
    emit(kind="result", status="tests", passed=passed, total=len(spec.get("tests", [])),
         failures=failures[:5], errors=errors[:5])


if __name__ == "__main__":
    main()
