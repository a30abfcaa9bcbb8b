"""Sequence packing, gradient checkpointing and CPU offload on torch.distributed (CPU, gloo): a world-size-2
run with all three trains, resumes from a checkpoint (saved by one offloaded process), and ends with the
weights of one process with them (2e-5, as ``test_distributed.py`` bounds world-size invariance), and of
one process without any (a plain module, no FSDP)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from rft_api.job import validate_spec
from tests.support.ports import free_port
from tests.support.runtime_config import local_config
from tests.trainer.dist_harness import run_rank

ATOL = 2e-5


def _config(tmp_path: Path, model_dir: Path, world: int, switches: bool) -> str:
    spec = validate_spec({
        "model": {"base": str(model_dir)},
        "dataset": {"train": {"builtin": "arithmetic", "size": 8}},
        "evaluator": {"builtin": "regex", "config": {"pattern": "[0-9]"}},
        "rollout": {"samplesPerPrompt": 2, "promptsPerStep": 5, "maxTokens": 6},
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": 3, "microBatchSize": 2,
                    "epochsPerStep": 2, "kl": {"coef": 0.05}, "processesPerNode": world,
                    **({"sequencePacking": True, "gradientCheckpointing": True, "cpuOffload": True}
                       if switches else {})},
    })
    return local_config("scale", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "ckpt",
                        output=tmp_path / "out").to_json()


def _train(tmp_path: Path, model_dir: Path, world: int, name: str, switches: bool = True,
           steps: tuple[int, ...] = (1, 2, 3), resume_from: Path | None = None,
           save_after: int | None = None) -> dict[str, torch.Tensor]:
    out = tmp_path / name
    out.mkdir()
    try:
        mp.spawn(run_rank, nprocs=world, join=True,
                 args=(_config(tmp_path, model_dir, world, switches), free_port(), list(steps), str(out),
                       str(resume_from) if resume_from else None, save_after))
    except ProcessException:
        for log in sorted(out.glob("rank-*.log")):
            print(f"--- {log.name}\n{log.read_text()[-4000:]}")
        raise
    if switches:  # the switches really ran: every rank's log says its layers checkpoint
        for log in out.glob("rank-*.log"):
            text = log.read_text()
            assert "activation checkpointing: 2 decoder layers" in text
            assert "CPU offload: the parameters, gradients and optimizer state of 2 decoder layers" in text
    return torch.load(out / "weights.pt")


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=ATOL, msg=k)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("scale1")
    return tmp, _train(tmp, tiny_model_dir, 1, "run", save_after=1)


def test_world_size_2_with_packing_and_checkpointing_matches_one_process(tmp_path, tiny_model_dir, one_process):
    _, want = one_process
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert max(float((want[k] - start[k]).abs().max()) for k in want) > 100 * ATOL  # the steps moved the weights
    _assert_same(_train(tmp_path, tiny_model_dir, 2, "ws2"), want)
    _assert_same(_train(tmp_path, tiny_model_dir, 1, "plain", switches=False), want)


def test_world_size_2_resumes_a_checkpoint_and_ends_where_one_process_does(tmp_path, tiny_model_dir, one_process):
    ws1, want = one_process
    ckpt = ws1 / "run" / "ckpt-1"
    assert (ckpt / "dcp").is_dir()
    _assert_same(_train(tmp_path, tiny_model_dir, 2, "resumed", steps=(2, 3), resume_from=ckpt), want)
