"""Where and in which dtype the trainer computes (``model.dtype``) and which process it is."""

from __future__ import annotations

import pytest
import torch

from rft_runtime.trainer.distributed import DistContext, row_shard
from rft_runtime.trainer.model_io import compute_dtype, torch_dtype


def test_auto_stores_float32_and_computes_bfloat16_only_on_a_gpu():
    assert torch_dtype("auto") == torch.float32  # master weights, on every device
    assert compute_dtype("auto", torch.device("cpu")) is None  # never bfloat16 on the CPU by default
    assert compute_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert torch_dtype("bfloat16") == torch.bfloat16 and compute_dtype("bfloat16", torch.device("cuda", 0)) is None


def test_context_device_and_backend_follow_the_machine():
    ctx = DistContext(rank=1, world_size=2, local_rank=1)
    if torch.cuda.is_available():
        assert ctx.device == torch.device("cuda", 1 % torch.cuda.device_count()) and ctx.backend == "nccl"
    else:
        assert ctx.device == torch.device("cpu") and ctx.backend == "gloo"
    with pytest.raises(ValueError, match="rank 2 is outside the world size 2"):
        DistContext(rank=2, world_size=2)


@pytest.mark.parametrize("n, world", [(10, 4), (3, 4), (8, 2), (1, 1)])
def test_row_shards_cover_the_batch_once_with_equal_lengths(n, world):
    shards = [row_shard(n, r, world) for r in range(world)]
    assert len({len(rows) for rows, _ in shards}) == 1  # every rank runs the same micro-batches
    live_rows = [int(i) for rows, live in shards for i, ok in zip(rows, live) if ok]
    assert sorted(live_rows) == list(range(n))


def test_global_rank_from_the_node_index_and_the_local_rank(tmp_path, monkeypatch):
    from rft_api.job import validate_spec
    from rft_runtime.trainer.distributed import NODE_ENV, context_for
    from tests.runtime_config import local_config

    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": {"builtin": "math"}, "trainer": {"nodes": 2, "processesPerNode": 3}})
    cfg = local_config("j", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path, output=tmp_path)
    monkeypatch.setenv(NODE_ENV, "1")  # the pod's JOB_COMPLETION_INDEX
    ctx = context_for(cfg, local_rank=2)
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.port) == (5, 6, 2, 29500)
    assert ctx.master_address == "127.0.0.1" and not ctx.is_main
    assert context_for(cfg, local_rank=0, node=0).is_main
    with pytest.raises(ValueError, match="node 2 is outside trainer.nodes 2"):
        context_for(cfg, node=2)


def test_a_trainer_of_several_processes_is_not_run_alone(tmp_path):
    from rft_api.job import validate_spec
    from rft_runtime.trainer.distributed import context_for
    from rft_runtime.trainer.trainer import Trainer
    from tests.runtime_config import local_config

    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": {"builtin": "math"}, "trainer": {"processesPerNode": 2}})
    cfg = local_config("j", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path, output=tmp_path)
    with pytest.raises(ValueError, match="a trainer of 2 processes"):
        Trainer(cfg)
    with pytest.raises(ValueError, match="the Trainer is rank 0; rank 1 follows it"):
        Trainer(cfg, dist=context_for(cfg, local_rank=1, node=0))
