"""Eval Protocol evaluators as the reward, run unchanged (``evaluator.evalProtocol``).

The user's file (or module) defines an Eval Protocol ``@evaluation_test`` or ``@reward_function``
with the real ``eval-protocol`` package (the ``rft-operator[eval-protocol]`` extra; the runtime image
has it). Each sample becomes an :class:`eval_protocol.models.EvaluationRow`:

- ``messages``: the conversation the sample ends (prompt, then the sampled assistant reply);
- ``ground_truth``: the task's ground truth; ``input_metadata.row_id``: the task id (every sample of
  one task shares it, as rows of one Eval Protocol group do); ``input_metadata.dataset_info``: the
  task's metadata and ``domain``;
- ``execution_metadata.extra``: the training fields in the shapes of Eval Protocol's training rollout
  processors (:func:`training_extra`), one completion per row.

Then the function is called as Eval Protocol itself calls it, and ``evaluation_result.score`` is the
reward (its ``reason``, and each metric's score under the metric's name):

==============================  =====================================================================
``@evaluation_test`` pointwise  ``await test(row)``, which returns the row with ``evaluation_result``
``@evaluation_test`` groupwise  ``await test(rows)`` with the n rows of one task (one call per group)
``@reward_function`` pointwise  ``fn(messages=[...], ground_truth=...)`` → ``EvaluateResult``
``@reward_function`` batch      ``fn(rollouts_messages=[[...], ...], ground_truth=...)`` → one each
==============================  =====================================================================

Groupwise and batch functions score a task's samples together (:meth:`EvalProtocolEvaluator.score_group`);
the composite calls it once per group. ``is_score_valid: false`` on the result flags the sample with a
``parse_error`` and keeps the score the function gave.

Importing ``eval_protocol`` imports LiteLLM, which would fetch a model price list from the internet on
import; :func:`import_eval_protocol` makes it use its bundled copy (``LITELLM_LOCAL_MODEL_COST_MAP``)
unless the environment already says otherwise, and turns off Eval Protocol's SQLite row log in
``$HOME`` (``DISABLE_EP_SQLITE_LOG``), which a scoring pod has no use for. LiteLLM also sets the
``httpx`` logger to WARNING for the whole process on import; its level is put back.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from types import ModuleType
from typing import Any, Sequence

from .. import usercode
from ..usercode import UserCodeError
from .options import ConfigError
from .types import Item, Sample, ScoreResult, normalise_result

__all__ = ["EvalProtocolEvaluator", "import_eval_protocol", "load_eval_protocol_function", "training_extra",
           "to_row", "result_of"]

_WHAT = "Eval Protocol evaluator"
_INSTALL = ("the eval-protocol package is not installed: pip install 'rft-operator[eval-protocol]' "
            "(the runtime image has it)")


def import_eval_protocol() -> ModuleType:
    """``eval_protocol.models``, imported without network access; ConfigError when it is missing."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("DISABLE_EP_SQLITE_LOG", "1")  # no row log in $HOME from the scoring pods
    httpx_log = logging.getLogger("httpx")
    level = httpx_log.level
    try:
        with warnings.catch_warnings():  # its models use pydantic v1-style config (a deprecation warning)
            warnings.simplefilter("ignore", DeprecationWarning)
            from eval_protocol import models
    except ImportError as exc:
        raise ConfigError(f"{_INSTALL} ({exc})") from None
    finally:
        httpx_log.setLevel(level)  # LiteLLM quiets httpx's request log for the whole process on import
    return models


def _kind(obj: Any) -> tuple[str, str] | None:
    """("evaluation_test" | "reward_function", mode) for a decorated function, else None."""
    meta = getattr(obj, "_metainfo", None)
    if callable(obj) and isinstance(meta, dict) and hasattr(obj, "_origin_func") and "mode" in meta:
        return "evaluation_test", str(meta["mode"])
    mode = getattr(obj, "_reward_function_mode", None)
    if callable(obj) and isinstance(mode, str):
        return "reward_function", mode
    return None


def load_eval_protocol_function(*, path: str | None = None, module: str | None = None,
                                test: str | None = None) -> tuple[Any, str, str, str]:
    """``(function, kind, mode, where)`` of the decorated function in a file or module.

    Without ``test``, the file must define exactly one ``@evaluation_test`` or ``@reward_function``.
    Raises ConfigError naming the file and the reason.
    """
    import_eval_protocol()
    where = path or module or ""
    try:
        if path is not None:
            mod = usercode.load_file(path, reference=path, what=_WHAT)
        elif module is not None:
            mod = usercode.import_module(module, reference=module, what=_WHAT)
        else:
            raise ConfigError("an evalProtocol evaluator needs configMapKeyRef (a file) or entrypoint (a module)")
        if test is not None:
            fn = usercode.get_attribute(mod, test, reference=f"{where}:{test}", owner=where)
            kind = _kind(fn)
            if kind is None:
                raise ConfigError(f"{where}:{test} is not an Eval Protocol @evaluation_test or @reward_function")
            return fn, kind[0], kind[1], f"{where}:{test}"
    except UserCodeError as exc:
        raise ConfigError(str(exc)) from None
    found = {name: obj for name, obj in vars(mod).items() if _kind(obj) is not None
             and getattr(obj, "__module__", mod.__name__) == mod.__name__}
    if len(found) != 1:
        listed = ", ".join(sorted(found)) or "none"
        raise ConfigError(f"{where}: set evalProtocol.test to the function to run; the file defines "
                          f"{len(found)} @evaluation_test / @reward_function functions ({listed})")
    (name, fn), = found.items()
    kind = _kind(fn)
    assert kind is not None
    return fn, kind[0], kind[1], f"{where}:{name}"


def training_extra(prompt_ids: Sequence[int], completions: Sequence[Sample]) -> dict[str, Any]:
    """``execution_metadata.extra`` training fields for a prompt and its sampled completions, in the
    shapes of Eval Protocol's training rollout processors: ``prompt_ids: list[int]``,
    ``completion_ids: list[list[int]]``, ``inference_logprobs: list[list[float]]``,
    ``completions_text: list[str]``, ``truncated: list[bool]``, ``finish_reasons: list[str]``."""
    return {
        "prompt_ids": [int(t) for t in prompt_ids],
        "completion_ids": [[int(t) for t in s.completion_ids] for s in completions],
        "inference_logprobs": [[float(x) for x in s.logprobs] for s in completions],
        "completions_text": [s.text for s in completions],
        "truncated": [bool(s.truncated) for s in completions],
        "finish_reasons": [s.finish_reason or "" for s in completions],
    }


def _messages(sample: Sample, item: Item) -> list[dict[str, Any]]:
    if sample.messages:
        return [dict(m) for m in sample.messages]
    return [*(dict(m) for m in (item.messages or [])), {"role": "assistant", "content": sample.text}]


def to_row(sample: Sample, item: Item) -> Any:
    """The ``EvaluationRow`` Eval Protocol would hand the evaluator for this sample."""
    models = import_eval_protocol()
    extra = training_extra(sample.prompt_ids, [sample])
    return models.EvaluationRow(
        messages=[models.Message.model_validate(m) for m in _messages(sample, item)],
        ground_truth=item.ground_truth,
        input_metadata=models.InputMetadata(row_id=item.task_id,
                                            dataset_info={**item.metadata, "domain": item.domain}),
        execution_metadata=models.ExecutionMetadata(rollout_id=sample.id, extra=extra),
    )


def result_of(value: Any, where: str) -> ScoreResult:
    """An ``EvaluateResult`` (or a row carrying one) as a ScoreResult; ValueError when there is none."""
    evaluation = getattr(value, "evaluation_result", value) if not isinstance(value, dict) else value
    if evaluation is None:
        raise ValueError(f"{where} returned a row without evaluation_result")
    result = normalise_result(evaluation)
    if getattr(evaluation, "is_score_valid", True) is False:
        result.error = "parse_error"
    return result


async def _await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class EvalProtocolEvaluator:
    """Runs one Eval Protocol function as an evaluator (see the module docstring)."""

    is_async = True

    def __init__(self, fn: Any, kind: str, mode: str, where: str) -> None:
        if kind == "evaluation_test" and mode not in ("pointwise", "groupwise"):
            raise ConfigError(f"{where}: @evaluation_test mode {mode!r} cannot score training samples "
                              "(pointwise or groupwise can)")
        if kind == "reward_function" and mode not in ("pointwise", "batch"):
            raise ConfigError(f"{where}: @reward_function mode {mode!r} is not supported (pointwise or batch are)")
        self.fn, self.kind, self.mode, self.source = fn, kind, mode, where
        self.grouped = mode in ("groupwise", "batch")

    @classmethod
    def load(cls, *, path: str | None = None, module: str | None = None, test: str | None = None) -> "EvalProtocolEvaluator":
        return cls(*load_eval_protocol_function(path=path, module=module, test=test))

    async def score(self, sample: Sample, item: Item) -> ScoreResult:
        """One sample; a groupwise or batch function is called with a group of one."""
        if self.grouped:
            return (await self.score_group([sample], item))[0]
        if self.kind == "evaluation_test":
            return result_of(await _await(self.fn(to_row(sample, item))), self.source)
        return result_of(await _await(self.fn(messages=_messages(sample, item), ground_truth=item.ground_truth)),
                         self.source)

    async def score_group(self, samples: Sequence[Sample], item: Item) -> list[ScoreResult]:
        """The samples of one task, scored in one call of a groupwise or batch function (the composite
        calls it for those only: ``grouped``)."""
        if self.kind == "evaluation_test":
            out = await _await(self.fn([to_row(s, item) for s in samples]))
        else:
            out = await _await(self.fn(rollouts_messages=[_messages(s, item) for s in samples],
                                       ground_truth=item.ground_truth))
        if not isinstance(out, list) or len(out) != len(samples):
            got = f"{len(out)} results" if isinstance(out, list) else type(out).__name__
            raise ValueError(f"{self.source} returned {got} for a group of {len(samples)}")
        return [result_of(v, self.source) for v in out]

    def __repr__(self) -> str:
        return f"EvalProtocolEvaluator({self.source!r}, {self.kind}, {self.mode})"
