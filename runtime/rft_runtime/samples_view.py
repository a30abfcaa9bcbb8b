"""Sampled completions people can read: the record the trainer writes (:mod:`.trainer.samples`) and what
``rft samples`` and ``kubectl rft samples`` print from it.

A step's samples are a list of prompts (one object per group of ``rollout.samplesPerPrompt`` samples)::

    {"step": 12, "task_id": "arith-7", "domain": "default", "prompt": "...", "reference": "42",
     "reward_mean": 0.5, "completions": [{"index": 0, "text": "...", "reward": 1.0, "correct": true,
                                          "reason": "...", "finish": "stop", "truncated": false,
                                          "termination": "stop", "errors": [], "error": null,
                                          "tokens": 7}, ...]}

The trainer writes them to ``samples/step-NNNNNN.jsonl`` on the checkpoint volume (one prompt per line)
and keeps the last steps in the progress ConfigMap's ``samples.json`` key (the file ``samples.json``
next to ``progress.json`` on one machine): ``{"steps": [{"step": N, "time": ..., "samples": [...]}]}``,
bounded by :func:`bound_steps`. Texts longer than ``spec.tracking.samples.maxChars`` are cut in the
middle (:func:`cut_middle`); the values of the trainer's secret environment variables are masked
(:func:`mask`). This module needs neither torch nor a Kubernetes client.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from rft_api.progress import SAMPLES_KEY

MAX_KEPT_STEPS = 8
"""Steps kept in ``samples.json``: the first one written and the newest ones."""
MAX_DOC_BYTES = 256 * 1024
"""The most ``samples.json`` holds (UTF-8 bytes); texts are cut further, then old steps dropped, to fit."""
SHRINK_CAPS = (1000, 400, 160)
"""The shorter text lengths :func:`bound_steps` tries, in turn, when the steps do not fit."""
FILE_PATTERN = re.compile(r"^step-(\d+)\.jsonl$")
SECRET_ENV_NAMES = ("RFT_S3_ACCESS_KEY_ID", "RFT_S3_SECRET_ACCESS_KEY", "RFT_HF_TOKEN", "MLFLOW_TRACKING_TOKEN",
                    "MLFLOW_TRACKING_PASSWORD", "WANDB_API_KEY")
"""Environment variables whose values are masked whatever their length."""
SECRET_SUFFIXES = ("_TOKEN", "_SECRET", "_PASSWORD", "_KEY")
MIN_SECRET_LEN = 8
"""Any other variable whose name ends in one of :data:`SECRET_SUFFIXES` is masked from this length on."""
MASK = "***"
_MARKER = re.compile(r"…\[(\d+) characters cut\]…")
PROMPT_CHARS = 600
"""How much of a prompt the command-line views print (the record keeps up to ``maxChars``)."""


class SamplesError(Exception):
    """Samples that are not there (one line for the user)."""


def file_name(step: int) -> str:
    """``step-NNNNNN.jsonl``: a step's samples on the checkpoint volume."""
    return f"step-{step:06d}.jsonl"


# ------------------------------------------------------------------ texts

def _marker(n: int) -> str:
    return f"…[{n} characters cut]…"


def cut_middle(text: str, max_chars: int) -> str:
    """``text`` at most ``max_chars`` long: its head and tail around ``…[N characters cut]…``. A text
    already cut this way is cut further, its marker then counting every character cut."""
    if len(text) <= max_chars:
        return text
    before = 0
    found = list(_MARKER.finditer(text))
    if len(found) == 1:  # cut before: join its two ends, and count what was cut then too
        m = found[0]
        before = int(m.group(1))
        text = text[:m.start()] + text[m.end():]
    keep = max(max_chars - len(_marker(before + len(text))), 0)
    cut = len(text) - keep
    if cut <= 0:
        return text if not before else text[:len(text) // 2] + _marker(before) + text[len(text) // 2:]
    head = (keep + 1) // 2
    return text[:head] + _marker(before + cut) + text[len(text) - (keep - head):]


def secret_values(environ: Optional[Mapping[str, str]] = None, names: Iterable[str] = ()) -> list[str]:
    """The values to mask, longest first: those of :data:`SECRET_ENV_NAMES` and ``names`` (any length),
    and of any variable named ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD`` or ``*_KEY`` (8 characters or more)."""
    env = os.environ if environ is None else environ
    always = set(SECRET_ENV_NAMES) | set(names)
    out = set()
    for name, value in env.items():
        v = (value or "").strip()
        if not v:
            continue
        if name in always or (name.upper().endswith(SECRET_SUFFIXES) and len(v) >= MIN_SECRET_LEN):
            out.add(v)
    return sorted(out, key=lambda v: (-len(v), v))


def mask(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret value replaced by ``***``."""
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    return text


def clean(text: str, secrets: Sequence[str], max_chars: int) -> str:
    """A text as written: secrets masked, then cut to ``max_chars``."""
    return cut_middle(mask(text, secrets), max_chars)


# ------------------------------------------------------------------ the samples.json document

def _shrink_step(entry: Mapping[str, Any], cap: Optional[int], completions: Optional[int] = None,
                 prompts: Optional[int] = None) -> dict[str, Any]:
    """A copy of a step's entry with texts cut to ``cap``, at most ``completions`` per prompt and
    ``prompts`` prompts (the number left out is noted as ``omitted``)."""
    def c(text: Any) -> Any:
        return cut_middle(text, cap) if cap is not None and isinstance(text, str) else text

    samples = list(entry.get("samples") or [])
    out_samples = []
    for group in samples[:prompts] if prompts is not None else samples:
        g = dict(group)
        for k in ("prompt", "reference"):
            g[k] = c(g.get(k))
        comps = list(g.get("completions") or [])
        kept = comps[:completions] if completions is not None else comps
        g["completions"] = [{**x, "text": c(x.get("text")), "reason": c(x.get("reason")), "error": c(x.get("error"))}
                            for x in kept]
        if len(kept) < len(comps):
            g["omitted_completions"] = len(comps) - len(kept) + int(g.get("omitted_completions") or 0)
        out_samples.append(g)
    out = {**entry, "samples": out_samples}
    if len(out_samples) < len(samples):
        out["omitted_prompts"] = len(samples) - len(out_samples) + int(entry.get("omitted_prompts") or 0)
    return out


def _estimate(steps: Sequence[Mapping[str, Any]], cap: Optional[int]) -> int:
    """About the size of ``steps`` with texts cut to ``cap`` (a lower bound give or take the JSON quoting),
    counted without writing them out."""
    def n(text: Any) -> int:
        return min(len(text), cap) if cap is not None and isinstance(text, str) else len(str(text or ""))

    total = 0
    for entry in steps:
        for g in entry.get("samples") or []:
            total += n(g.get("prompt")) + n(g.get("reference")) + 100
            total += sum(n(c.get("text")) + n(c.get("reason")) + n(c.get("error")) + 100
                         for c in g.get("completions") or [])
    return total


def _size(steps: list[dict[str, Any]]) -> int:
    return len(dump_steps(steps).encode())


def dump_steps(steps: list[dict[str, Any]]) -> str:
    """The ``samples.json`` text of ``steps``."""
    return json.dumps({"steps": steps}, ensure_ascii=False, separators=(",", ":"))


def keep_steps(steps: Sequence[Mapping[str, Any]], keep: int = MAX_KEPT_STEPS) -> list[dict[str, Any]]:
    """The steps ``samples.json`` keeps, in order: the first and the newest, ``keep`` in all."""
    ordered = sorted((dict(s) for s in steps), key=lambda s: int(s["step"]))
    if len(ordered) <= keep:
        return ordered
    return [ordered[0]] + ordered[len(ordered) - (keep - 1):]


def bound_steps(steps: Sequence[Mapping[str, Any]], limit: int = MAX_DOC_BYTES) -> list[dict[str, Any]]:
    """The steps to write as ``samples.json`` (:func:`keep_steps`), made to fit in ``limit`` bytes: texts
    cut shorter (:data:`SHRINK_CAPS`), then the oldest steps dropped (the first step last), then the
    newest step's completions and prompts thinned."""
    kept = keep_steps(steps)
    if not kept or (_estimate(kept, None) <= 2 * limit and _size(kept) <= limit):
        return kept
    shrunk = kept
    for cap in SHRINK_CAPS:
        if _estimate(kept, cap) > 2 * limit and cap != SHRINK_CAPS[-1]:
            continue  # far too big at this length: no need to write it out to know
        shrunk = [_shrink_step(s, cap) for s in kept]
        if _size(shrunk) <= limit:
            return shrunk
    cap = SHRINK_CAPS[-1]
    while len(shrunk) > 1:
        del shrunk[1 if len(shrunk) > 2 else 0]  # the oldest after the first, the first when two are left
        if _size(shrunk) <= limit:
            return shrunk
    newest = shrunk[0]
    most = max((len(g.get("completions") or []) for g in newest.get("samples") or []), default=0)
    completions, prompts = most, len(newest.get("samples") or [])
    while completions > 1 or prompts > 1:
        if completions > 1:
            completions //= 2
        else:
            prompts //= 2
        candidate = [_shrink_step(newest, cap, completions, prompts)]
        if _size(candidate) <= limit:
            return candidate
    return [_shrink_step(newest, 40, 1, 1)]


def parse_steps(text: str) -> list[dict[str, Any]]:
    """The step entries of a ``samples.json`` text, oldest first (SamplesError when it is not one)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SamplesError(f"{SAMPLES_KEY} is not JSON: {e}") from None
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("step"), int) for s in steps):
        raise SamplesError(f"{SAMPLES_KEY} has no list of steps")
    return sorted(steps, key=lambda s: s["step"])


def pick_step(steps: Sequence[Mapping[str, Any]], step: Optional[int], where: str) -> Mapping[str, Any]:
    """The entry of ``step`` (the newest when None); SamplesError naming the steps kept when absent."""
    if not steps:
        raise SamplesError(f"no samples in {where} yet")
    if step is None:
        return steps[-1]
    for s in steps:
        if s["step"] == step:
            return s
    kept = ", ".join(str(s["step"]) for s in steps)
    raise SamplesError(f"step {step} is not kept in {where} (steps kept: {kept}); every written step's samples "
                       f"are on the checkpoint claim under samples/{file_name(step)}")


# ------------------------------------------------------------------ printing

def _num(x: Any) -> str:
    return "n/a" if not isinstance(x, (int, float)) or isinstance(x, bool) else f"{x:.3f}"


def _indent(text: str, pad: str) -> str:
    return "\n".join(pad + line for line in (text or "").splitlines() or [""])


def completion_header(c: Mapping[str, Any]) -> str:
    """``completion 3 · reward 1.000 · correct · stop · errors: timeout``."""
    parts = [f"completion {c.get('index', '?')}", f"reward {_num(c.get('reward'))}"]
    if c.get("correct") is not None:
        parts.append("correct" if c["correct"] else "not correct")
    finish = c.get("finish") or c.get("termination")
    if finish:
        parts.append(str(finish) + (" (truncated)" if c.get("truncated") and finish != "length" else ""))
    elif c.get("truncated"):
        parts.append("truncated")
    if c.get("errors"):
        parts.append("errors: " + ", ".join(c["errors"]))
    return " · ".join(parts)


def format_step(entry: Mapping[str, Any], *, prompt_chars: int = PROMPT_CHARS, steps: Sequence[int] = (),
                steps_label: str = "steps kept") -> str:
    """The lines ``rft samples`` and ``kubectl rft samples`` print for one step: per prompt, the prompt
    (cut to ``prompt_chars``), then each completion with its reward, correctness and the evaluator's reason."""
    samples = list(entry.get("samples") or [])
    head = f"step {entry.get('step')}: {len(samples)} prompt{'s' if len(samples) != 1 else ''}"
    if entry.get("omitted_prompts"):
        head += f" ({entry['omitted_prompts']} more left out to fit)"
    if steps:
        head += f"   ({steps_label}: " + ", ".join(str(s) for s in steps) + ")"
    lines = [head]
    for i, g in enumerate(samples, 1):
        title = [f"prompt {i}/{len(samples)}", f"task {g.get('task_id')}"]
        if g.get("domain") and g.get("domain") != "default":
            title.append(f"domain {g['domain']}")
        if g.get("reference") is not None:
            title.append(f"reference {cut_middle(str(g['reference']), 80)}")
        title.append(f"mean reward {_num(g.get('reward_mean'))}")
        lines += ["", "━━ " + " · ".join(title), _indent(cut_middle(g.get("prompt") or "", prompt_chars), "   ")]
        for c in g.get("completions") or []:
            lines += ["", "  ── " + completion_header(c), _indent(c.get("text") or "", "     ")]
            if c.get("reason"):
                lines.append(_indent(f"reason: {c['reason']}", "     "))
            if c.get("error"):
                lines.append(_indent(f"error: {c['error']}", "     "))
        if g.get("omitted_completions"):
            lines.append(f"  ({g['omitted_completions']} more completions left out to fit)")
    return "\n".join(lines)


# ------------------------------------------------------------------ a local run's files

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The prompts of a ``step-NNNNNN.jsonl`` file."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def step_files(directory: Path) -> dict[int, Path]:
    """``{step: file}`` of the ``step-NNNNNN.jsonl`` files in ``directory``."""
    if not directory.is_dir():
        return {}
    found = {}
    for p in directory.iterdir():
        m = FILE_PATTERN.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def local_steps(directory: Path) -> tuple[dict[int, Path], Optional[Path]]:
    """Where a local run keeps its samples: ``(step files, samples.json)`` under ``directory``, which may
    be ``rft run``'s output directory, its ``checkpoints/`` or ``checkpoints/samples/``."""
    for d in (directory / "checkpoints" / "samples", directory / "samples", directory):
        files = step_files(d)
        if files:
            return files, None
    doc = directory / SAMPLES_KEY
    return {}, doc if doc.is_file() else None


def load_local(directory: Path, step: Optional[int]) -> tuple[dict[str, Any], list[int]]:
    """(the entry of ``step`` or of the newest step, every step available) of a local run's samples."""
    if not directory.is_dir():
        raise SamplesError(f"{directory} is not a directory")
    files, doc = local_steps(directory)
    if files:
        if step is None:
            step = max(files)
        if step not in files:
            raise SamplesError(f"no samples of step {step} in {files[max(files)].parent} (steps written: "
                               f"{', '.join(str(s) for s in files)})")
        return {"step": step, "samples": read_jsonl(files[step])}, list(files)
    if doc is None:
        raise SamplesError(f"no samples under {directory} (the trainer writes them to checkpoints/samples/ at the "
                           "first step and every spec.tracking.samples.everySteps steps)")
    steps = parse_steps(doc.read_text(encoding="utf-8"))
    return dict(pick_step(steps, step, str(doc))), [s["step"] for s in steps]


def main(argv: Optional[list[str]] = None) -> int:
    """``rft samples DIR [--step N] [-o json]``: a local run's sampled completions."""
    p = argparse.ArgumentParser(prog="rft samples", description="Print the sampled completions of a local run "
                                "(rft run --out DIR): prompts, completions, rewards and the evaluator's reasons.")
    p.add_argument("dir", type=Path, help="the run's output directory (or its checkpoints/samples/)")
    p.add_argument("--step", type=int, default=None, help="this step (default: the newest written)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    a = p.parse_args(argv)
    try:
        entry, steps = load_local(a.dir, a.step)
    except (SamplesError, OSError, ValueError) as e:
        print(f"rft samples: {e}", file=sys.stderr)
        return 1
    if a.output == "json":
        print(json.dumps(entry, ensure_ascii=False, indent=1))
    else:
        shown = steps if len(steps) <= 20 else steps[:1] + steps[-19:]
        print(format_step(entry, steps=shown, steps_label="steps written" if len(steps) <= 20 else "steps written, "
                          "the first and the newest"))
    return 0
