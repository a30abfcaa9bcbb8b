"""What a checkpoint holds, and writing/reading it.

Files in a checkpoint directory (see :mod:`.checkpoint` for the atomic protocol)::

    weights.safetensors   trainable parameters by name (the whole model, or the LoRA adapter)
    optimizer.pt          optimiser state_dict
    scheduler.pt          LR scheduler state_dict
    rng.pt                python, numpy and torch RNG states
    trainer_state.json    step, policy version, data cursor, pending tasks, submission counter,
                          cumulative counters, and what the run was (algorithm, LoRA, model)

Trainable parameters are stored by ``named_parameters()`` names (tied weights appear once).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "weights.safetensors"


class ResumeError(RuntimeError):
    """A checkpoint cannot be resumed by this run; the message says why and what to change."""


@dataclass
class TrainerState:
    """The JSON part of a checkpoint."""

    step: int
    policy_version: int
    cursor: dict[str, Any]
    pending_tasks: list[dict[str, Any]] = field(default_factory=list)
    next_seq: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    eval_score: float | None = None
    run: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        d = json.loads(text)
        try:
            return cls(step=int(d["step"]), policy_version=int(d["policy_version"]), cursor=dict(d["cursor"]),
                       pending_tasks=list(d.get("pending_tasks", [])), next_seq=int(d.get("next_seq", 0)),
                       counters=dict(d.get("counters", {})), eval_score=d.get("eval_score"),
                       run=dict(d.get("run", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise ResumeError(f"{STATE_FILE}: field {e} is missing or malformed") from None


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU, and CUDA when present) RNG states."""
    out: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                           "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters by name, detached contiguous CPU copies."""
    return {n: p.detach().to("cpu").contiguous().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable parameters into ``model``; names must match exactly."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    if missing or unexpected:
        raise ResumeError(f"{WEIGHTS_FILE}: parameters do not match the model (missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]}); was the checkpoint written with another model or "
                          "LoRA setting?")
    with torch.no_grad():
        for n, p in params.items():
            t = tensors[n]
            if t.shape != p.shape:
                raise ResumeError(f"{WEIGHTS_FILE}: parameter {n} has shape {tuple(t.shape)}, the model "
                                  f"{tuple(p.shape)}")
            p.copy_(t.to(p.dtype))


def write_checkpoint(directory: Path, state: TrainerState, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Write every file of a checkpoint into ``directory`` (not atomic by itself)."""
    save_file(trainable_state(model), str(directory / WEIGHTS_FILE))
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    torch.save(scheduler.state_dict() if scheduler is not None else {}, directory / "scheduler.pt")
    torch.save(rng_state(), directory / "rng.pt")
    (directory / STATE_FILE).write_text(state.to_json())


def read_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, *, expect_run: dict[str, Any] | None = None) -> TrainerState:
    """Restore model, optimiser, scheduler and RNG states from ``directory``; returns the state.

    ``expect_run`` lists run properties that must equal the checkpoint's (algorithm, LoRA, ...).
    """
    path = directory / STATE_FILE
    if not path.exists():
        raise ResumeError(f"{directory}: {STATE_FILE} is missing")
    state = TrainerState.from_json(path.read_text())
    for k, v in (expect_run or {}).items():
        if k in state.run and state.run[k] != v:
            raise ResumeError(f"{directory}: the checkpoint was written with {k}={state.run[k]!r}, this run has "
                              f"{k}={v!r}")
    load_trainable_state(model, load_file(str(directory / WEIGHTS_FILE)))
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=False))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(directory / "rng.pt", weights_only=False))
    return state
