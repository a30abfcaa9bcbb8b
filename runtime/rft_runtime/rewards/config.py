"""The reward configuration: the job's evaluators (``spec.evaluator``) resolved for the scoring process.

There is one input shape, the CRD's :class:`rft_api.spec.EvaluatorSpec`, parsed once by pydantic;
where its file evaluators are mounted and which env var holds each API key come from the runtime
contract (:meth:`rft_api.runtime.RuntimeConfig.evaluators`). ``rft reward --config FILE`` reads the
runtime config (``config.json``) like every other role.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from pydantic import ValidationError

from rft_api import runtime
from rft_api.constants import DEFAULT_REWARD_RANGE
from rft_api.layout import api_key_env_name
from rft_api.runtime import RuntimeConfig
from rft_api.spec import EvaluatorEntry as SpecEntry
from rft_api.spec import EvaluatorSpec

from .options import ConfigError

__all__ = ["EvaluatorEntry", "RewardConfig", "api_key_env_name", "evaluator_names", "from_runtime_config", "from_spec",
           "parse_evaluator_spec", "load_reward_config"]

DEFAULT_CONCURRENCY = 16


@dataclass
class EvaluatorEntry:
    """One evaluator as the scoring process builds it: ``kind`` is builtin, entrypoint, file or
    eval_protocol (``path`` or ``entrypoint`` the file or module, ``function`` the test's name or "")."""

    name: str
    kind: Literal["builtin", "entrypoint", "file", "eval_protocol"]
    weight: float = 1.0
    timeout_seconds: float | None = None
    builtin: str | None = None
    entrypoint: str | None = None
    path: str | None = None
    function: str = "score"
    config: dict[str, Any] = field(default_factory=dict)
    explicit_name: bool = False
    domains: list[str] | None = None
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
    """The rewards it may return (``rewardRange``); others are refused (:class:`~.composite.Slot`)."""


@dataclass
class RewardConfig:
    """Evaluators and service settings."""

    evaluators: list[EvaluatorEntry]
    timeout_seconds: float = 30.0
    concurrency: int = DEFAULT_CONCURRENCY
    on_error: Literal["zero", "exclude"] = "zero"


def parse_evaluator_spec(raw: Mapping[str, Any] | EvaluatorSpec) -> EvaluatorSpec:
    """``spec.evaluator`` (a dict in the CRD's camelCase shape) validated; errors name the field."""
    if isinstance(raw, EvaluatorSpec):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"spec.evaluator: must be an object, got {type(raw).__name__}")
    try:
        return EvaluatorSpec.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = ".".join(str(x) for x in ("spec.evaluator", *err["loc"]))
            problems.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError("; ".join(problems)) from None


def _default_name(e: SpecEntry) -> str:
    if e.builtin is not None:
        return e.builtin
    if e.bundle is not None:
        return e.bundle.entrypoint.rpartition(":")[2]
    if e.eval_protocol is not None:
        return e.eval_protocol.test or "eval_protocol"
    assert e.file is not None
    return e.file.function


def evaluator_names(spec: Mapping[str, Any] | EvaluatorSpec) -> list[str]:
    """The names the composite gives a job's evaluators (the keys of per-evaluator metrics)."""
    entries = [EvaluatorEntry(name=e.name or _default_name(e), kind="builtin", explicit_name=e.name is not None)
               for e in parse_evaluator_spec(spec).entries()]
    _unique_names(entries)
    return [e.name for e in entries]


def _entry(e: SpecEntry, index: int, file_path: str | None, key_env: str | None) -> EvaluatorEntry:
    from .registry import BUILTINS

    config = dict(e.config.model_dump(by_alias=True, exclude_none=True)) if e.config is not None else {}
    entry = EvaluatorEntry(name=e.name or _default_name(e), kind="builtin", weight=e.weight, timeout_seconds=e.timeout_seconds,
                           config=config, explicit_name=e.name is not None,
                           domains=list(e.domains) if e.domains is not None else None,
                           reward_range=(e.reward_range.min, e.reward_range.max) if e.reward_range is not None
                           else DEFAULT_REWARD_RANGE)
    where = f"spec.evaluator.evaluators[{index}]"
    if e.builtin is not None:
        if e.builtin not in BUILTINS:
            raise ConfigError(f"{where}.builtin: {e.builtin!r}; known: {', '.join(BUILTINS.names())}")
        entry.builtin = e.builtin
        if e.api_key_secret_ref is not None:
            entry.config.setdefault("apiKeyEnv", key_env or api_key_env_name(index))
    elif e.bundle is not None:
        entry.kind, entry.entrypoint = "entrypoint", e.bundle.entrypoint
    elif e.eval_protocol is not None:
        ep = e.eval_protocol
        if ep.config_map_key_ref is not None and not file_path:
            raise ConfigError(f"config: evaluator {index} is an evalProtocol file evaluator but paths.evaluatorFiles "
                              "has no entry for it")
        entry.kind, entry.function = "eval_protocol", ep.test or ""
        entry.path, entry.entrypoint = (file_path, None) if ep.config_map_key_ref is not None else (None, ep.entrypoint)
    else:
        assert e.file is not None  # exactly one kind: the EvaluatorEntry rule
        if not file_path:
            raise ConfigError(f"config: evaluator {index} is a file evaluator but paths.evaluatorFiles has no entry "
                              "for it")
        entry.kind, entry.path, entry.function = "file", file_path, e.file.function
    return entry


def from_spec(spec: Mapping[str, Any] | EvaluatorSpec, *, files: Mapping[int, str] | None = None,
              key_envs: Mapping[int, str] | None = None, concurrency: int = DEFAULT_CONCURRENCY) -> RewardConfig:
    """The reward config of ``spec.evaluator``; ``files`` maps a file evaluator's index to its path,
    ``key_envs`` an evaluator's index to the env var holding its API key."""
    ev = parse_evaluator_spec(spec)
    entries = [_entry(e, i, (files or {}).get(i), (key_envs or {}).get(i)) for i, e in enumerate(ev.entries())]
    _unique_names(entries)
    if not any(e.weight > 0 for e in entries):
        raise ConfigError("spec.evaluator: at least one evaluator needs a weight above 0")
    if concurrency < 1:
        raise ConfigError(f"reward concurrency must be at least 1, got {concurrency}")
    return RewardConfig(evaluators=entries, timeout_seconds=ev.timeout_seconds, concurrency=concurrency,
                        on_error=ev.on_error)


def from_runtime_config(cfg: RuntimeConfig) -> RewardConfig:
    """The reward config of a job's runtime config: its evaluators at their mounted paths, API keys
    in their env vars, ``spec.rollout.concurrency`` samples scored at once."""
    resolved = cfg.evaluators()
    return from_spec(cfg.spec.evaluator, files={r.index: r.file_path for r in resolved if r.file_path},
                     key_envs={r.index: r.api_key_env for r in resolved if r.api_key_env},
                     concurrency=cfg.spec.rollout.concurrency)


def load_reward_config(path: str) -> RewardConfig:
    """The reward config of a runtime config file (``config.json``)."""
    try:
        return from_runtime_config(runtime.load(path))
    except runtime.ConfigError as e:
        raise ConfigError(str(e)) from None


def _unique_names(entries: list[EvaluatorEntry]) -> None:
    """Refuses duplicate explicit names; numbers defaulted ones that collide (math_1, math_2)."""
    explicit = [e.name for e in entries if e.explicit_name]
    dupes = sorted({n for n in explicit if explicit.count(n) > 1})
    if dupes:
        raise ConfigError(f"spec.evaluator: evaluator name(s) {', '.join(dupes)} used more than once")
    names = [e.name for e in entries]
    counters: dict[str, int] = {}
    for e in entries:
        if not e.explicit_name and names.count(e.name) > 1:
            counters[e.name] = counters.get(e.name, 0) + 1
            e.name = f"{e.name}_{counters[e.name]}"
    final = [e.name for e in entries]
    clash = sorted({n for n in final if final.count(n) > 1})
    if clash:
        raise ConfigError(f"spec.evaluator: evaluator name(s) {', '.join(clash)} used more than once")
