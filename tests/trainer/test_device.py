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
    from tests.support.runtime_config import local_config

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
    from tests.support.runtime_config import local_config

    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": {"builtin": "math"}, "trainer": {"processesPerNode": 2}})
    cfg = local_config("j", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path, output=tmp_path)
    with pytest.raises(ValueError, match="a trainer of 2 processes"):
        Trainer(cfg)
    with pytest.raises(ValueError, match="the Trainer is rank 0; rank 1 follows it"):
        Trainer(cfg, dist=context_for(cfg, local_rank=1, node=0))


def _grpo_batch(tmp_path):
    """A tiny model and an 8-row GRPO batch (groups of 4, responses of 3-10 tokens)."""
    from rft_runtime.algos import compute_advantages
    from rft_runtime.model import make_tiny_model
    from rft_runtime.trainer.batch import TrainSequence

    model_dir = make_tiny_model(tmp_path / "m", seed=3, hidden=32, layers=2, intermediate=64,
                                max_position_embeddings=32)
    g = torch.Generator().manual_seed(0)
    seqs = [TrainSequence(group=f"t{i // 4}", prompt_ids=torch.randint(3, 200, (6,), generator=g).tolist(),
                          response_ids=torch.randint(3, 200, (3 + i,), generator=g).tolist(),
                          response_mask=[1] * (3 + i), inference_logprobs=[-1.0] * (3 + i), reward=float(i % 3 == 0),
                          version=0, truncated=False, episode_id=f"e{i}") for i in range(8)]
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs], dtype=torch.float64),
                             [s.group for s in seqs])
    return model_dir, seqs, adv


def test_update_after_the_old_logprob_pass_has_the_unsharded_gradient(tmp_path):
    """The trainer's default step is a no-gradient log-prob pass, then the update. Under FSDP2 the root
    module kept the parameters it had gathered for that pass, and the update computed wrong gradients for
    the root's own parameters (here a gradient norm of 0.38 instead of 1.06). The sharded trainer must
    give the plain model's gradient whether or not the pass came first."""
    from transformers import AutoModelForCausalLM

    from rft_runtime.trainer import distributed
    from rft_runtime.trainer.batch import collate
    from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer

    model_dir, seqs, adv = _grpo_batch(tmp_path)
    ctx = DistContext()
    distributed.ensure_group(ctx)

    def grad_norm(sharded: bool, recompute: bool) -> float:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if sharded:
            model = distributed.fsdp(model, ctx, None)  # what world sizes above 1 run
        learner = Learner(model, LearnerConfig(micro_batch_size=4), build_optimizer(list(model.parameters()), 1e-6, 0.0))
        batch = collate(seqs)
        old = learner.logprobs(batch) if recompute else reference_old
        return learner.update(batch, adv.advantages.float(), adv.valid, old)["grad_norm"]

    plain_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference_old = Learner(plain_model, LearnerConfig(micro_batch_size=4),
                            build_optimizer(list(plain_model.parameters()), 1e-6, 0.0)).logprobs(collate(seqs))
    plain = grad_norm(sharded=False, recompute=True)
    assert grad_norm(sharded=True, recompute=False) == pytest.approx(plain, rel=1e-5)  # the update alone
    assert grad_norm(sharded=True, recompute=True) == pytest.approx(plain, rel=1e-5)  # after the pass


def test_one_process_computing_in_bfloat16_is_a_plain_module_under_autocast(tmp_path):
    """World size 1 with a compute dtype (a GPU with ``model.dtype: auto``) keeps a plain module whose
    forward runs under ``torch.autocast``: float32 parameters and gradients, bfloat16 logits, and an
    update within bfloat16's rounding of both the float32 one and FSDP2's mixed precision (which two or
    more ranks run)."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import AutoModelForCausalLM

    from rft_runtime.trainer import distributed
    from rft_runtime.trainer.batch import collate
    from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer

    model_dir, seqs, adv = _grpo_batch(tmp_path)
    ctx = DistContext()
    distributed.ensure_group(ctx)
    batch = collate(seqs)

    def step(how: str) -> tuple[torch.nn.Module, dict]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if how == "autocast":
            model = distributed.shard(model, ctx, torch.bfloat16)
        elif how == "fsdp":
            model = distributed.fsdp(model, ctx, torch.bfloat16)
        learner = Learner(model, LearnerConfig(micro_batch_size=4), build_optimizer(list(model.parameters()), 1e-3, 0.0))
        old = learner.logprobs(batch)
        return model, learner.update(batch, adv.advantages.float(), adv.valid, old)

    model, auto = step("autocast")
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())
    out = model(input_ids=batch.input_ids.to(ctx.device), attention_mask=batch.attention_mask.to(ctx.device),
                use_cache=False)
    assert out.logits.dtype == torch.bfloat16
    _, fp32 = step("float32")
    _, fsdp = step("fsdp")
    for key in ("loss", "grad_norm"):
        assert auto[key] == pytest.approx(fp32[key], rel=3e-2, abs=1e-3), (key, auto, fp32)
        assert auto[key] == pytest.approx(fsdp[key], rel=3e-2, abs=1e-3), (key, auto, fsdp)
    assert auto["grad_norm"] != fp32["grad_norm"]  # it did compute in bfloat16
