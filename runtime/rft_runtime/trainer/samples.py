"""A few sampled completions where people look (``spec.tracking.samples``).

At the first step, every ``everySteps`` steps and at the last step, :class:`SampleLog` takes ``perStep``
of the step's groups (spread over their mean rewards: the worst, the best and evenly between) and writes,
for each, the task, the prompt as the model saw it, the task's reference answer, and every sampled
completion with its reward, correctness, the evaluator's reason, how it ended and its error flags
(:mod:`rft_runtime.samples_view` has the record), to

* ``samples/step-NNNNNN.jsonl`` on the checkpoint volume (one prompt per line, replaced atomically);
* TensorBoard, as markdown text tagged ``samples`` (:meth:`..metrics_sink.MetricsSink.text`);
* the experiment trackers: an MLflow artifact ``samples/step-NNNNNN.json``, a W&B table ``samples``;
* the progress ConfigMap's ``samples.json`` key (``samples.json`` next to ``progress.json`` on one
  machine): the first and the newest steps, at most 8, under 256 KiB (``kubectl rft samples``).

Texts are decoded from the token ids (the prompt with its special tokens, completions without), cut in
the middle beyond ``maxChars``, and the values of the trainer's secret environment variables are masked
in every one. Writing samples never stops training: a failure is counted and warned once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from rft_api.runtime import RuntimeConfig

from ..progress import now_rfc3339
from ..samples_view import (
    SECRET_ENV_NAMES,
    bound_steps,
    clean,
    completion_header,
    dump_steps,
    file_name,
    keep_steps,
    read_jsonl,
    secret_values,
    step_files,
)
from ..types import Episode
from .checkpoint import write_text_atomic

if TYPE_CHECKING:
    from ..coordinator import Group
    from .report import RunReport

log = logging.getLogger(__name__)

SAMPLES_DIR = "samples"
TAG = "samples"
ERROR_KINDS = ("timeout", "runtime_error", "parse_error", "rollout_error")


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def group_mean_reward(group: Any) -> float | None:
    """The mean of a group's finite rewards (None when it has none)."""
    return _mean([_finite(ep.reward) for ep in group.episodes])


def pick_groups(groups: Sequence[Any], n: int) -> list[Any]:
    """``n`` of ``groups`` in their order: all when there are no more, else evenly spaced in the order of
    their mean reward (the lowest and the highest included; groups without a reward count as lowest)."""
    if len(groups) <= n:
        return list(groups)
    order = sorted(range(len(groups)), key=lambda i: (_sort_key(group_mean_reward(groups[i])), i))
    if n == 1:
        chosen = {order[(len(order) - 1) // 2]}
    else:
        chosen = {order[round(k * (len(order) - 1) / (n - 1))] for k in range(n)}
    return [groups[i] for i in sorted(chosen)]


def _sort_key(x: float | None) -> float:
    return -math.inf if x is None else x


def _decode(tokenizer: Any, ids: Sequence[int], skip_special: bool) -> str | None:
    if tokenizer is None or not ids:
        return None
    try:
        return str(tokenizer.decode(list(ids), skip_special_tokens=skip_special))
    except Exception:  # noqa: BLE001 - an id the tokenizer does not know: fall back to the engine's text
        return None


def _task_prompt(task: dict[str, Any]) -> str:
    if isinstance(task.get("prompt"), str):
        return task["prompt"]
    msgs = task.get("messages")
    if isinstance(msgs, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in msgs if isinstance(m, dict))
    return ""


def _reference(task: dict[str, Any]) -> str | None:
    gt = task.get("ground_truth")
    if gt is None:
        return None
    return gt if isinstance(gt, str) else json.dumps(gt, ensure_ascii=False)


def completion_record(ep: Episode, tokenizer: Any, secrets: Sequence[str], max_chars: int) -> dict[str, Any]:
    """One sampled completion as written (its text decoded without special tokens; a multi-turn one with
    the tool or environment tokens between its turns)."""
    text, tokens, finish, truncated = "", 0, None, False
    traj = ep.trajectory() if ep.trajectories else None
    if traj is not None and traj.steps:
        try:
            ids = traj.merged().response_ids
        except ValueError:  # turns that do not extend each other: their responses one after the other
            ids = [t for s in traj.steps for t in s.response_ids]
        decoded = _decode(tokenizer, ids, True)
        text = decoded if decoded is not None else "".join(s.response_text or "" for s in traj.steps)
        tokens = sum(s.num_sampled_tokens for s in traj.steps)
        finish, truncated = traj.steps[-1].finish_reason, bool(traj.steps[-1].truncated)
    return {
        "index": ep.rollout_idx, "text": clean(text, secrets, max_chars), "reward": _finite(ep.reward),
        "correct": ep.is_correct,
        "reason": clean(ep.reward_reason, secrets, max_chars) if ep.reward_reason else None,
        "finish": finish, "truncated": truncated, "termination": ep.termination_reason,
        "errors": [k for k in ERROR_KINDS if getattr(ep.errors, k)],
        "error": clean(ep.errors.message, secrets, max_chars) if ep.errors.message else None,
        "tokens": tokens,
    }


def group_record(step: int, group: Any, tokenizer: Any, secrets: Sequence[str], max_chars: int) -> dict[str, Any]:
    """One prompt and its sampled completions as written (the prompt decoded with its special tokens: the
    text the model saw, chat template included)."""
    task = getattr(group, "task", None)
    task = task if isinstance(task, dict) else {}
    eps = sorted(group.episodes, key=lambda e: e.rollout_idx)
    prompt = None
    for ep in eps:
        if ep.trajectories and ep.trajectory().steps:
            prompt = _decode(tokenizer, ep.trajectory().steps[0].prompt_ids, False)
            break
    if prompt is None:
        prompt = _task_prompt(task)
    reference = _reference(task)
    task_id = str(task.get("task_id") or (eps[0].task_id if eps else getattr(group, "key", "?")))
    completions = [completion_record(ep, tokenizer, secrets, max_chars) for ep in eps]
    return {
        "step": int(step), "task_id": clean(task_id, secrets, max_chars), "domain": task.get("domain"),
        "prompt": clean(prompt, secrets, max_chars),
        "reference": clean(reference, secrets, max_chars) if reference is not None else None,
        "reward_mean": _mean([c["reward"] for c in completions]), "completions": completions,
    }


# ------------------------------------------------------------------ TensorBoard markdown

def _fence(text: str) -> str:
    """``text`` as a fenced code block whose fence no run of backticks in it can close."""
    run, best = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        best = max(best, run)
    fence = "`" * max(3, best + 1)
    return f"{fence}\n{text}\n{fence}"


_MD_INLINE = str.maketrans({**{c: "\\" + c for c in "\\`*_[]"}, "<": "&lt;", ">": "&gt;", "\n": " "})


def _md(text: str) -> str:
    """``text`` as one line of markdown that shows as written (no emphasis, code, link or HTML)."""
    return text.translate(_MD_INLINE)


def markdown(step: int, rows: Sequence[dict[str, Any]]) -> str:
    """A step's samples as the markdown TensorBoard shows under ``samples``."""
    parts = [f"**step {step}**: {len(rows)} prompt{'s' if len(rows) != 1 else ''}"]
    for i, g in enumerate(rows, 1):
        title = f"### prompt {i}: task {_md(str(g['task_id']))}"
        if g.get("reference") is not None:
            title += f" · reference {_md(g['reference'])}"
        mean = g.get("reward_mean")
        title += f" · mean reward {'n/a' if mean is None else f'{mean:.3f}'}"
        parts += [title, _fence(g["prompt"])]
        for c in g["completions"]:
            parts += [f"**{_md(completion_header(c))}**", _fence(c["text"])]
            if c.get("reason"):
                parts.append(f"reason: {_md(c['reason'])}")
            if c.get("error"):
                parts.append(f"error: {_md(c['error'])}")
    return "\n\n".join(parts)


# ------------------------------------------------------------------ the log

class SampleLog:
    """Writes a few of a step's samples (see the module docstring); :meth:`record` is called every step
    and decides whether the step is one to write."""

    def __init__(self, cfg: RuntimeConfig, report: RunReport) -> None:
        s = cfg.spec.tracking.samples
        self.every, self.per_step, self.max_chars = s.every_steps, s.per_step, s.max_chars
        self.report = report
        self.directory = Path(cfg.paths.checkpoints) / SAMPLES_DIR
        self.secret_names = sorted({*SECRET_ENV_NAMES, *(e.env for e in cfg.secret_env),
                                    *(e.name for e in cfg.spec.trainer.env if e.value_from is not None)})
        self.kept: list[dict[str, Any]] | None = None  # the steps in samples.json (read from the volume first)
        self.errors = 0
        self._warned = False

    def due(self, step: int, last: bool = False) -> bool:
        """Whether ``step``'s samples are written: the first step, every ``everySteps``, the last step."""
        return self.every > 0 and (step == 1 or last or step % self.every == 0)

    def record(self, step: int, groups: list[Group], tokenizer: Any, last: bool = False) -> None:
        """Write ``step``'s samples when it is due (never raises)."""
        if not self.due(step, last) or not groups:
            return
        try:
            secrets = secret_values(os.environ, self.secret_names)
            rows = [group_record(step, g, tokenizer, secrets, self.max_chars)
                    for g in pick_groups(groups, self.per_step)]
        except Exception as e:  # noqa: BLE001 - samples never stop training
            self._failed("reading the step's samples", e)
            return
        for what, write in (("the samples file", self._write_file), ("TensorBoard", self._write_tensorboard),
                            ("the trackers", self._write_trackers), ("the progress record", self._write_progress)):
            try:
                write(step, rows)
            except Exception as e:  # noqa: BLE001 - samples never stop training
                self._failed(f"writing samples to {what}", e)

    def path(self, step: int) -> Path:
        return self.directory / file_name(step)

    def _write_file(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path(step), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def _write_tensorboard(self, step: int, rows: list[dict[str, Any]]) -> None:
        if self.report.metrics is not None:
            self.report.metrics.text(TAG, markdown(step, rows), step)

    def _write_trackers(self, step: int, rows: list[dict[str, Any]]) -> None:
        for tracker in self.report.trackers:
            tracker.log_samples(step, rows)

    def _write_progress(self, step: int, rows: list[dict[str, Any]]) -> None:
        sink = self.report.progress_sink
        if sink is None:
            return
        if self.kept is None:
            self.kept = self._kept_on_volume(before=step)
        entry = {"step": int(step), "time": now_rfc3339(), "samples": rows}
        # steps from this one on were written by an attempt that did not finish them: this one redoes them
        self.kept = bound_steps([s for s in self.kept if s["step"] < step] + [entry])
        sink.write_samples(dump_steps(self.kept))

    def _kept_on_volume(self, before: int) -> list[dict[str, Any]]:
        """The steps before ``before`` that earlier attempts of the job wrote and ``samples.json`` keeps
        (read from their files: the ones of later steps are redone by this attempt)."""
        files = {s: p for s, p in step_files(self.directory).items() if s < before}
        out = []
        for stub in keep_steps([{"step": s} for s in files]):
            path = files[stub["step"]]
            try:
                when = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                out.append({"step": stub["step"], "time": when, "samples": read_jsonl(path)})
            except (OSError, ValueError) as e:
                log.warning("samples of step %d not carried over from %s: %s", stub["step"], path, e)
        return bound_steps(out)

    def _failed(self, what: str, e: Exception) -> None:
        self.errors += 1
        if not self._warned:
            self._warned = True
            log.warning("%s failed (training goes on; further failures are not logged): %s", what, e)
