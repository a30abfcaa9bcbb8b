"""What a checkpoint holds, and writing/reading it.

Files in a checkpoint directory (see :mod:`.checkpoint` for the atomic protocol)::

    dcp/                  model and optimiser state, a torch.distributed.checkpoint written by every
                          rank (its shards); it loads at any world size (resharded on load)
    weights.safetensors   trainable parameters by name, gathered whole (the whole model, or the
                          LoRA adapter): for ``model.warmStartFrom`` and for reading outside torch.distributed
    scheduler.pt          LR scheduler state_dict
    rng.pt                python, numpy and torch RNG states (rank 0's)
    trainer_state.json    step, policy version, data cursor, pending tasks, submission counter,
                          cumulative counters, and what the run was (algorithm, LoRA, model)

Trainable parameters are stored by ``named_parameters()`` names (tied weights appear once).
Writing and reading are collective when a process group exists (every rank calls them with the same
directory, on a volume they share); rank 0 alone writes the files other than ``dcp/``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from .checkpoint import ResumeError

STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "weights.safetensors"


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
    reward_moments: dict[str, Any] = field(default_factory=dict)
    """Running reward moments per domain (``dataset.mix[].rewardNormalization: running``)."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """The held-out evaluation's state (baseline, best, curve, early stop): ``evaluation.EvalState``."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        d = json.loads(text)
        try:
            return cls(step=int(d["step"]), policy_version=int(d["policy_version"]), cursor=dict(d["cursor"]),
                       pending_tasks=list(d.get("pending_tasks", [])), next_seq=int(d.get("next_seq", 0)),
                       counters=dict(d.get("counters", {})), eval_score=d.get("eval_score"),
                       run=dict(d.get("run", {})), reward_moments=dict(d.get("reward_moments", {})),
                       evaluation=dict(d.get("evaluation") or {}))
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


DCP_DIR = "dcp"


def _is_main() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def full_trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """:func:`trainable_state` of the whole (gathered) model: on rank 0 of a process group (an empty
    dict on the others; collective), or of an unsharded model without one."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return trainable_state(model)
    from .distributed import full_state_dict

    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {n: t.contiguous() for n, t in full_state_dict(model).items() if n in names}


def write_checkpoint(directory: Path, state: TrainerState | None, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Write every file of a checkpoint into ``directory`` (not atomic by itself; collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(directory / DCP_DIR))
    weights = full_trainable_state(model)
    if not _is_main():
        return
    if state is None:
        raise ValueError("rank 0 writes the trainer state of a checkpoint: state is required")
    save_file(weights, str(directory / WEIGHTS_FILE))
    torch.save(scheduler.state_dict() if scheduler is not None else {}, directory / "scheduler.pt")
    torch.save(rng_state(), directory / "rng.pt")
    (directory / STATE_FILE).write_text(state.to_json())


def check_checkpoint(directory: Path, *, expect_run: dict[str, Any] | None = None) -> TrainerState:
    """The state of the checkpoint in ``directory``, checked against this run before anything is
    loaded (``expect_run``: run properties that must equal the checkpoint's: algorithm, LoRA, ...)."""
    path = directory / STATE_FILE
    if not path.exists():
        raise ResumeError(f"{directory}: {STATE_FILE} is missing")
    state = TrainerState.from_json(path.read_text())
    for k, v in (expect_run or {}).items():
        if k in state.run and state.run[k] != v:
            raise ResumeError(f"{directory}: the checkpoint was written with {k}={state.run[k]!r}, this run has "
                              f"{k}={v!r}")
    if not (directory / DCP_DIR).is_dir():
        raise ResumeError(f"{directory}: {DCP_DIR}/ is missing (a checkpoint of an older trainer without "
                          "torch.distributed checkpoints cannot be resumed; use it as model.warmStartFrom)")
    return state


def load_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore model, optimiser, scheduler and RNG states from ``directory`` (collective: the model and
    optimiser are resharded to this process group's ranks, whatever world size wrote them)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    loaded: dict[str, Any] = {"model": msd, "optim": osd}
    try:
        dcp.load(loaded, checkpoint_id=str(directory / DCP_DIR))
    except Exception as e:  # noqa: BLE001 - DCP reports mismatches in many exception types
        raise ResumeError(f"{directory / DCP_DIR}: the model and optimiser state do not fit this run ({e}); was "
                          "the checkpoint written with another model or LoRA setting?") from None
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(directory / "rng.pt", weights_only=False))


def read_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, *, expect_run: dict[str, Any] | None = None) -> TrainerState:
    """:func:`check_checkpoint`, then :func:`load_checkpoint`; returns the state."""
    state = check_checkpoint(directory, expect_run=expect_run)
    load_checkpoint(directory, model, optimizer, scheduler)
    return state
