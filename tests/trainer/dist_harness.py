"""One trainer rank of the world-size invariance test (``tests/trainer/test_distributed.py``).

Each process builds the real :class:`~rft_runtime.trainer.trainer.Worker` of its rank — the FSDP2-
sharded policy and reference, AdamW, the scheduler — in a gloo process group, trains the given
steps on fixed episodes (every rank gets the whole batch and trains its rows, as when rank 0
broadcasts a step), optionally resumes from or writes a distributed checkpoint, and rank 0 saves the
gathered full state dict. ``bf16_compute``: compute in bfloat16 over float32 weights, as ``model.dtype:
auto`` does on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def steps_batch(step: int) -> list[Any]:
    """The sequences of ``step``: 5 groups of 2 (10 rows: uneven over 4 ranks, so padding runs), the two
    rows of a group sharing their prompt (so its forward runs once, :mod:`rft_runtime.trainer.prefix`)."""
    from rft_runtime.trainer.batch import sequences_from_groups
    from tests.trainer.conftest import make_groups

    return sequences_from_groups(make_groups(n_groups=5, n=2, seed=step, shared_prompt=True))


def run_rank(rank: int, config_json: str, port: int, steps: list[int], out: str, resume_from: str | None,
             save_after: int | None, bf16_compute: bool = False) -> None:
    import os

    # Each rank logs to its own file (shown by the test on failure), not into pytest's captured fds.
    log = os.open(Path(out) / f"rank-{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    import faulthandler

    # a rank that dies of a signal (a gloo thread's std::terminate: SIGABRT, seen once in CI) leaves the
    # Python stack of each of its threads in its log
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    import logging

    import torch.distributed as dist

    # the trainer's INFO lines (which layers it compiled, say) go to the rank's log, where tests read them
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from rft_api import runtime
    from rft_runtime.trainer.distributed import context_for
    from rft_runtime.trainer.state import TrainerState
    from rft_runtime.trainer.trainer import Worker

    if bf16_compute:  # what ``model.dtype: auto`` computes in on a GPU, here on the CPU
        from rft_runtime.trainer import model_io, trainer

        def bf16(name: str, device: torch.device) -> torch.dtype | None:
            return torch.bfloat16 if name == "auto" else None

        model_io.compute_dtype = trainer.compute_dtype = bf16
    cfg = runtime.parse(config_json)
    ctx = context_for(cfg, local_rank=rank, node=0, port=port)
    worker = Worker(cfg, ctx).load()
    if resume_from:
        worker.restore(resume_from)
    for step in steps:
        worker.train(steps_batch(step), step)
        if step == save_after:
            d = Path(out) / f"ckpt-{step}"
            if rank == 0:
                d.mkdir(parents=True)
            dist.barrier()
            worker.save(str(d), TrainerState(step=step, policy_version=step, cursor={}) if rank == 0 else None)
    sd = worker.gather()
    if rank == 0:
        torch.save(sd, Path(out) / "weights.pt")
    dist.barrier()
    dist.destroy_process_group()
