"""The reward configuration: the RFTJob's evaluator entries plus service settings.

Accepted shapes (YAML or JSON, camelCase as in the CRD)::

    evaluators:                              # or a single entry at the top level
      - builtin: math                        # math | string_check | regex | code_sandbox | llm_judge
        weight: 1.0
        name: correctness                    # optional; defaults to the builtin / function name
        timeoutSeconds: 5                    # optional; defaults to the top-level timeoutSeconds
        config: {...}                        # the builtin's settings
        apiKeySecretRef: {name, key}         # llm_judge: the key arrives in env RFT_EVALUATOR_<index>_API_KEY
      - entrypoint: "my_pkg.rewards:score"   # or bundle: {entrypoint: ...} as in the CRD
        weight: 0.5
      - file: /etc/rft/eval.py               # or file: {path: ...} / {configMapKeyRef: {name, key}}
        function: score
    timeoutSeconds: 30                       # per sample and evaluator
    concurrency: 16                          # samples scored at once
    onError: zero                            # zero | exclude (what a raised error or timeout counts as)
    filesDir: /etc/rft/evaluator             # where configMapKeyRef files are mounted (<index>/<key>)

The operator's runtime config (``kind: RFTRuntimeConfig``, the ``config.json`` every role reads) is
accepted as well: its ``spec.evaluator`` is the CRD's EvaluatorSpec, ``paths.evaluatorFiles`` gives
each file evaluator's mounted path by index and ``secretEnv`` each API key's env var by index.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import yaml

from .options import ConfigError, Options

__all__ = ["EvaluatorEntry", "RewardConfig", "load_reward_config", "parse_reward_config", "api_key_env_name",
           "from_runtime_config", "DEFAULT_FILES_DIR", "RUNTIME_CONFIG_KIND"]

DEFAULT_FILES_DIR = "/etc/rft/evaluator"
RUNTIME_CONFIG_KIND = "RFTRuntimeConfig"
_ENTRY_KINDS = ("builtin", "entrypoint", "bundle", "file")
_TOP_LEVEL = {"evaluators", "timeoutSeconds", "concurrency", "onError", "filesDir", "remote"}


def api_key_env_name(index: int) -> str:
    """The environment variable that carries evaluator ``index``'s ``apiKeySecretRef`` into the
    scoring process (the operator's naming): ``RFT_EVALUATOR_<index>_API_KEY``."""
    return f"RFT_EVALUATOR_{index}_API_KEY"


@dataclass
class EvaluatorEntry:
    """One evaluator: ``kind`` is builtin, entrypoint or file."""

    name: str
    kind: Literal["builtin", "entrypoint", "file"]
    weight: float = 1.0
    timeout_seconds: float | None = None
    builtin: str | None = None
    entrypoint: str | None = None
    path: str | None = None
    function: str = "score"
    config: dict[str, Any] = field(default_factory=dict)
    explicit_name: bool = False


@dataclass
class RewardConfig:
    """Evaluators and service settings."""

    evaluators: list[EvaluatorEntry]
    timeout_seconds: float = 30.0
    concurrency: int = 16
    on_error: Literal["zero", "exclude"] = "zero"


def _file_path(value: Any, opts: Options, files_dir: str, index: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        if isinstance(value.get("path"), str):
            return value["path"]
        ref = value.get("configMapKeyRef")
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and isinstance(ref.get("key"), str):
            return os.path.join(files_dir, str(index), ref["key"])
    raise opts.error("file", "must be a path, {path: ...} or {configMapKeyRef: {name, key}}")


def _parse_entry(raw: Any, where: str, files_dir: str, index: int) -> EvaluatorEntry:
    opts = Options(raw, where)
    kinds = [k for k in _ENTRY_KINDS if isinstance(raw, Mapping) and raw.get(k) is not None]
    if len(kinds) != 1:
        raise ConfigError(f"{where}: set exactly one of {', '.join(_ENTRY_KINDS)} (got {', '.join(kinds) or 'none'})")
    kind = kinds[0]
    name = opts.str("name", None)
    weight = opts.number("weight", 1.0, minimum=0, maximum=1000)
    timeout = opts.number("timeoutSeconds", None, minimum=0.001, maximum=3600)
    config = opts.any("config", {})
    if not isinstance(config, Mapping):
        raise opts.error("config", "must be an object")
    config = dict(config)
    secret = opts.any("apiKeySecretRef", None)
    function = opts.str("function", "score")
    opts.any("remote", None)
    entry = EvaluatorEntry(name=name or "", kind="builtin", weight=weight, timeout_seconds=timeout,
                           function=function, config=config, explicit_name=name is not None)
    if kind == "builtin":
        from .registry import BUILTINS

        entry.builtin = opts.str("builtin")
        if entry.builtin not in BUILTINS:
            raise opts.error("builtin", f"is {entry.builtin!r}; known: {', '.join(BUILTINS.names())}")
        entry.name = name or entry.builtin
        if secret is not None and "apiKeyEnv" not in config:
            config["apiKeyEnv"] = api_key_env_name(index)
    elif kind in ("entrypoint", "bundle"):
        if kind == "bundle":
            bundle = opts.any("bundle")
            if not isinstance(bundle, Mapping) or not isinstance(bundle.get("entrypoint"), str):
                raise opts.error("bundle", "must be an object with entrypoint: 'module:function'")
            ref = bundle["entrypoint"]
        else:
            ref = opts.str("entrypoint")
        entry.kind, entry.entrypoint = "entrypoint", ref
        entry.name = name or ref.rpartition(":")[2] or ref
    else:
        file_value = opts.any("file")
        entry.kind, entry.path = "file", _file_path(file_value, opts, files_dir, index)
        if isinstance(file_value, Mapping) and isinstance(file_value.get("function"), str):
            entry.function = file_value["function"]  # the CRD keeps it inside file:
            function = entry.function
        entry.name = name or function
    opts.done()
    return entry


def parse_reward_config(raw: Any) -> RewardConfig:
    """A RewardConfig from the parsed YAML/JSON; raises ConfigError naming the bad field."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"reward config must be an object, got {type(raw).__name__}")
    if raw.get("kind") == RUNTIME_CONFIG_KIND:
        return parse_reward_config(from_runtime_config(raw))
    files_dir = raw.get("filesDir") or os.environ.get("RFT_EVALUATOR_FILES_DIR") or DEFAULT_FILES_DIR
    if "evaluators" in raw and raw["evaluators"] is not None:
        unknown = sorted(set(raw) - _TOP_LEVEL)
        if unknown:
            raise ConfigError(f"reward config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_TOP_LEVEL))}")
        items = raw["evaluators"]
        if not isinstance(items, list) or not items:
            raise ConfigError("reward config: field 'evaluators' must be a non-empty list")
        entries = [_parse_entry(e, f"evaluators[{i}]", files_dir, i) for i, e in enumerate(items)]
        top = raw
    else:
        single = {k: v for k, v in raw.items() if k not in ("concurrency", "onError", "filesDir", "remote")}
        single.pop("timeoutSeconds", None)
        entries = [_parse_entry(single, "evaluator", files_dir, 0)]
        top = raw
    opts = Options({k: top.get(k) for k in ("timeoutSeconds", "concurrency", "onError")}, "reward config")
    config = RewardConfig(
        evaluators=entries,
        timeout_seconds=opts.number("timeoutSeconds", 30.0, minimum=0.001, maximum=3600),
        concurrency=opts.number("concurrency", 16, minimum=1, maximum=4096, integer=True),
        on_error=opts.str("onError", "zero", choices=("zero", "exclude")),
    )
    _unique_names(entries)
    if not any(e.weight > 0 for e in entries):
        raise ConfigError("reward config: at least one evaluator needs a weight above 0")
    return config


def from_runtime_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The reward config inside the operator's RFTRuntimeConfig: ``spec.evaluator`` with file
    evaluators pointed at their mounted paths and API keys at their env vars (both by index)."""
    spec = raw.get("spec") or {}
    ev = spec.get("evaluator") if isinstance(spec, Mapping) else None
    if not isinstance(ev, Mapping):
        raise ConfigError("runtime config: field 'spec.evaluator' must be an object")
    paths = raw.get("paths") or {}
    files = {f.get("index"): f for f in paths.get("evaluatorFiles") or [] if isinstance(f, Mapping)}
    secrets = {s.get("index"): s.get("env") for s in raw.get("secretEnv") or [] if isinstance(s, Mapping)}
    top = {"timeoutSeconds", "onError", "remote", "evaluators"}
    if ev.get("evaluators") is not None:
        entries = [dict(e) for e in ev["evaluators"]]
    else:
        entries = [{k: v for k, v in ev.items() if k not in top}]
    for i, entry in enumerate(entries):
        if entry.get("file") is not None:
            if i not in files:
                raise ConfigError(f"runtime config: evaluator {i} is a file evaluator but paths.evaluatorFiles "
                                  "has no entry for it")
            entry["file"] = files[i]["path"]
            entry["function"] = files[i].get("function") or "score"
        if entry.get("apiKeySecretRef") is not None and i in secrets:
            config = dict(entry.get("config") or {})
            config.setdefault("apiKeyEnv", secrets[i])
            entry["config"] = config
    rollout = spec.get("rollout") or {}
    out: dict[str, Any] = {"evaluators": entries}
    for key in ("timeoutSeconds", "onError"):
        if ev.get(key) is not None:
            out[key] = ev[key]
    if isinstance(rollout, Mapping) and isinstance(rollout.get("concurrency"), int):
        out["concurrency"] = rollout["concurrency"]
    return out


def _unique_names(entries: list[EvaluatorEntry]) -> None:
    """Refuses duplicate explicit names; numbers defaulted ones that collide (math_1, math_2)."""
    explicit = [e.name for e in entries if e.explicit_name]
    dupes = sorted({n for n in explicit if explicit.count(n) > 1})
    if dupes:
        raise ConfigError(f"reward config: evaluator name(s) {', '.join(dupes)} used more than once")
    names = [e.name for e in entries]
    counters: dict[str, int] = {}
    for e in entries:
        if not e.explicit_name and names.count(e.name) > 1:
            counters[e.name] = counters.get(e.name, 0) + 1
            e.name = f"{e.name}_{counters[e.name]}"
    final = [e.name for e in entries]
    clash = sorted({n for n in final if final.count(n) > 1})
    if clash:
        raise ConfigError(f"reward config: evaluator name(s) {', '.join(clash)} used more than once")


def load_reward_config(path: str) -> RewardConfig:
    """Reads a YAML or JSON file (JSON is YAML) and parses it."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"reward config {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"reward config {path}: not valid YAML/JSON: {exc}") from None
    return parse_reward_config(raw)
