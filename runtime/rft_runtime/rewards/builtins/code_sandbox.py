"""Builtin ``code_sandbox``: run the completion's Python code against the item's tests, isolated.

The code is the last fenced ```python (or untagged) block of the completion, else the whole text.
The ground truth holds the tests, in one of these forms:
  * a string of test code (asserts), or a list of such strings (each block runs separately);
  * a list of ``{"input": str, "output": str}`` cases (stdin → expected stdout), or a dict with
    ``tests`` and/or ``cases`` (also APPS-style ``{"inputs": [...], "outputs": [...]}``).

Config (camelCase): ``language`` (``python``, the only one), ``timeoutSeconds`` (10, wall clock per
run), ``cpuSeconds`` (= timeout), ``memoryMB`` (512), ``maxProcesses`` (16), ``maxFileSizeMB`` (16),
``maxOpenFiles`` (64), ``maxOutputBytes`` (65536), ``sandboxUid``/``sandboxGid`` (65534),
``isolation`` (``auto`` | ``userns`` | ``root``; there is no unisolated mode: where no namespace can
be made the evaluator, and so the reward server, refuses to start), ``workQuotaMB`` (64: the size
of the private /work tmpfs), ``workMaxFiles`` (1024 inodes), ``readablePaths`` (added to the
read-only system paths the private root shows), ``deniedPaths`` (hidden even there; /var/run/secrets
and /run/secrets always), ``python`` (interpreter for the code), ``workRoot``, ``partialCredit``
(false: 1.0 only when every test passes; true: the fraction passed), ``requireCodeBlock`` (false),
``maxCases`` (50).

Trust: the verdict comes from the trusted harness process, never from the solution's process (see
``sandbox/harness.py``); the tests reach the harness on a pipe, never as a file; the reward is
clamped to [0, 1] whatever the harness reports.

Outcomes: all tests pass → 1.0; an assertion fails → 0.0; the code raises (including blocked
writes, reads, sockets, MemoryError, fork failures) → 0.0 with ``runtime_error``; a syntax error or
no code → 0.0 with ``parse_error``; wall-clock or CPU limit → 0.0 with ``timeout``. A sandbox that
cannot be set up raises ``EvaluatorError("runtime_error")`` (the composite's onError applies).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

from ..options import Options
from ..registry import register_builtin
from ..sandbox import SandboxPolicy, SandboxRun, probe_isolation, run_sandboxed
from ..types import EvaluatorError, Item, Sample, ScoreResult

__all__ = ["CodeSandboxEvaluator", "extract_code", "parse_tests"]

_HARNESS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox", "harness.py")
_HARNESS_INSIDE = "/.rft/_rft_harness.py"  # where the launcher places _rft_* files (read-only)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def extract_code(text: str, require_block: bool = False) -> str | None:
    """The last fenced Python (or untagged) block; else the whole text unless ``require_block``."""
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    if blocks:
        return blocks[-1]
    if require_block:
        return None
    return text if text.strip() else None


def parse_tests(ground_truth: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """(assertion test blocks, io cases) from a ground truth; raises ValueError naming the problem."""
    gt = ground_truth
    if isinstance(gt, str):
        try:
            decoded = json.loads(gt)
        except ValueError:
            decoded = None
        if isinstance(decoded, (list, dict)):
            gt = decoded
    if isinstance(gt, str):
        return [gt], []
    blocks: list[str] = []
    cases: list[tuple[str, str]] = []
    if isinstance(gt, dict):
        tests = gt.get("tests")
        if isinstance(tests, str):
            blocks.append(tests)
        elif isinstance(tests, list):
            b, c = parse_tests(tests)
            blocks += b
            cases += c
        if isinstance(gt.get("cases"), list):
            cases += parse_tests(gt["cases"])[1]
        if isinstance(gt.get("inputs"), list) and isinstance(gt.get("outputs"), list):
            if len(gt["inputs"]) != len(gt["outputs"]):
                raise ValueError("ground_truth.inputs and ground_truth.outputs differ in length")
            cases += [(str(i), str(o)) for i, o in zip(gt["inputs"], gt["outputs"])]
    elif isinstance(gt, list):
        for i, entry in enumerate(gt):
            if isinstance(entry, str):
                blocks.append(entry)
            elif isinstance(entry, dict) and "input" in entry and "output" in entry:
                cases.append((str(entry["input"]), str(entry["output"])))
            else:
                raise ValueError(f"ground_truth[{i}] must be test code or an {{input, output}} case")
    if not blocks and not cases:
        raise ValueError("ground_truth holds no tests (expected test code, a list of tests or io cases)")
    return blocks, cases


def _clamp(reward: float) -> float:
    """The declared range of this evaluator: [0, 1]."""
    return min(1.0, max(0.0, reward))


def _normalise_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@register_builtin("code_sandbox")
class CodeSandboxEvaluator:
    """Runs untrusted Python in the sandbox (see the module docstring)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        opts = Options(config, "code_sandbox config")
        language = opts.str("language", "python")
        if language != "python":
            raise opts.error("language", f"must be 'python' (the only supported language), got {language!r}")
        self.partial_credit = opts.bool("partialCredit", False)
        self.require_block = opts.bool("requireCodeBlock", False)
        self.max_cases = opts.number("maxCases", 50, minimum=1, integer=True)
        policy = SandboxPolicy.from_config(opts)
        opts.done()
        self.policy, self.isolation = probe_isolation(policy)  # refuses here when it cannot isolate
        with open(_HARNESS_PATH) as fh:
            self._harness = fh.read()

    async def _run(self, code: str, mode: str, tests: list[str], stdin: bytes | None) -> SandboxRun:
        files = {"solution.py": code, "_rft_harness.py": self._harness}
        if mode == "tests":  # the tests travel on the harness's stdin: never a file the solution could read
            stdin = json.dumps({"tests": tests}).encode()
        run = await run_sandboxed(self.policy, files, [_HARNESS_INSIDE, mode], stdin=stdin)
        if run.setup_error is not None:
            err = run.setup_error
            raise EvaluatorError("runtime_error", f"code_sandbox: sandbox setup failed at {err.get('stage')}: "
                                                  f"{err.get('error')}")
        return run

    def _failure(self, run: SandboxRun) -> ScoreResult | None:
        """The error outcome of a run, or None when the harness reported normally."""
        if run.timed_out:
            return ScoreResult.failure("timeout", f"code_sandbox: wall-clock limit {self.policy.timeout_seconds:g}s exceeded")
        result = run.result
        if result is None:
            if run.exit_code in (128 + 9, 128 + 24):  # SIGKILL / SIGXCPU without our timeout: CPU limit
                return ScoreResult.failure("timeout", f"code_sandbox: CPU limit {self.policy.cpu_seconds}s exceeded")
            tail = run.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return ScoreResult.failure("runtime_error", f"code_sandbox: exited with code {run.exit_code} "
                                                        f"without a result ({tail[0][:200]})")
        status = result.get("status")
        if status == "syntax_error":
            return ScoreResult.failure("parse_error", f"code_sandbox: {result.get('exc_type')}: {result.get('message')}")
        if status == "error":
            exc, msg = result.get("exc_type"), result.get("message")
            if result.get("signal") in (9, 24):  # SIGKILL / SIGXCPU of the solution's process: CPU limit
                return ScoreResult.failure("timeout", f"code_sandbox: CPU limit {self.policy.cpu_seconds}s exceeded")
            if exc == "exit":  # the solution's own process ended: its last stderr line says why
                last = run.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
                exc = last[0].split(":", 1)[0].strip() if re.fullmatch(r"[A-Za-z_.]+(:.*)?", last[0]) else exc
                msg = f"{msg} ({last[0][:200]})" if last[0] else msg
            note = f" (memory limit {self.policy.memory_mb} MB)" if exc == "MemoryError" else ""
            return ScoreResult.failure("runtime_error", f"code_sandbox: the code raised {exc}: {msg}{note}")
        return None

    async def score(self, sample: Sample, item: Item) -> ScoreResult:
        """Runs the tests; see the module docstring for the outcomes."""
        try:
            blocks, cases = parse_tests(item.ground_truth)
        except ValueError as exc:
            return ScoreResult(None, f"code_sandbox: {exc}")
        code = extract_code(sample.text, self.require_block)
        if code is None:
            return ScoreResult.failure("parse_error", "code_sandbox: no code in the completion")
        passed = total = 0
        notes: list[str] = []
        if blocks:
            run = await self._run(code, "tests", blocks, None)
            failed = self._failure(run)
            if failed is not None:
                return failed
            result = run.result or {}
            total = len(blocks)  # what we sent, not what a report claims
            passed = max(0, min(total, int(result.get("passed", 0))))
            errors = result.get("errors") or []
            if errors:
                e = errors[0]
                reward = _clamp(passed / total) if self.partial_credit and total else 0.0
                return ScoreResult(reward, f"code_sandbox: test {e.get('index')} raised {e.get('exc_type')}: "
                                           f"{e.get('message')}", {"tests_passed": passed, "tests_total": total},
                                   error="runtime_error")
            notes += [f"test {f['index']} failed: {f['message'] or 'assertion'}" for f in result.get("failures", [])]
        for stdin, expected in cases[: self.max_cases]:
            total += 1
            run = await self._run(code, "io", [], stdin.encode())
            failed = self._failure(run)
            if failed is not None:
                return failed
            got = run.stdout.decode(errors="replace")
            if _normalise_output(got) == _normalise_output(expected):
                passed += 1
            else:
                notes.append(f"case {total - 1}: expected {expected.strip()[:60]!r}, got {got.strip()[:60]!r}")
                if not self.partial_credit:
                    break
        metrics = {"tests_passed": float(passed), "tests_total": float(len(blocks) + min(len(cases), self.max_cases))}
        if passed == metrics["tests_total"]:
            return ScoreResult(1.0, f"code_sandbox: all {passed} tests passed", metrics)
        reward = _clamp(passed / metrics["tests_total"]) if self.partial_credit else 0.0
        return ScoreResult(reward, f"code_sandbox: {passed}/{int(metrics['tests_total'])} passed; {notes[0] if notes else ''}",
                           metrics)
