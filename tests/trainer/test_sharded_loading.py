"""Meta-device initialisation and sharded loading (:mod:`rft_runtime.trainer.sharded_load`), at world size 2 on gloo.

A small Llama-shaped model (random weights saved as safetensors from a config) is loaded both ways in the
same process group: the plain way (``from_pretrained`` on every rank, then FSDP2) and built on the meta
device with each rank reading its own shards. The gathered state dicts are equal exactly, a training step
(forward, backward, AdamW, forward) gives the same losses, the tied embedding stays tied, and while loading
a rank never holds more tensor bytes than its shard plus one layer's gathered parameters, which the plain
way exceeds (it materialises the whole model on every rank). The trainer's :class:`Worker` trains, writes a
distributed checkpoint and resumes from it through the sharded loader, ending where the uninterrupted run
and the one-process run (plain module) end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from tests.support.ports import free_port

WORLD = 2


def make_llama(out: Path, *, tied: bool = True, max_shard_size: str | None = None, seed: int = 0,
               stored: torch.dtype = torch.float32) -> Path:
    """A randomly initialised 4-layer Llama with the tiny model's tokenizer, saved as safetensors in
    ``stored`` (``max_shard_size``: several files and an index)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rft_runtime.model.tokenizer import VOCAB_SIZE, build_tokenizer

    cfg = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tied, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(stored)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kw)
    build_tokenizer().save_pretrained(out)
    return out


class LiveTensorBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once (CPU, not meta), over the storages of every
    tensor that goes into or comes out of an operation while it is active; storages alive before it
    started are not counted. A dispatch mode sees only its own thread's operations: the rank switches
    transformers' loading threads off (``HF_DEACTIVATE_ASYNC_LOAD``) so that the plain load is seen whole."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def _see(self, t: Any) -> None:
        if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t) and t.device.type == "cpu":
            s = t.untyped_storage()
            ref = StorageWeakRef(s)
            if ref.cdata not in self.live:
                self.live[ref.cdata] = (ref, s.nbytes())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from torch.utils._pytree import tree_flatten

        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            self._see(t)
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


def _bound(model: torch.nn.Module, world: int) -> tuple[int, int, int]:
    """(the model's bytes, this rank's shard: every tensor's rows padded to ``ceil(rows / world)``,
    the largest decoder layer's or the root's gathered bytes)."""
    def full(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    tensors = list(model.state_dict().values())
    total = sum(full(t) for t in {id(t): t for t in tensors}.values())
    shard = sum(-(-t.shape[0] // world) * full(t) // max(t.shape[0], 1) if t.dim() else full(t) for t in tensors)
    blocks = list(model.model.layers)  # type: ignore[union-attr]
    layer = max(sum(full(p) for p in b.parameters()) for b in blocks)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    root = sum(full(p) for p in model.parameters() if id(p) not in in_blocks)
    return total, shard, max(layer, root)


def _step(model: torch.nn.Module, ids: torch.Tensor) -> list[float]:
    """The loss before and after one AdamW step on ``ids`` (next-token cross-entropy)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def load_both_rank(rank: int, model_dir: str, port: int, dtype_name: str, out: str) -> None:
    """One rank: the plain and the sharded load (each measured), their state dicts, a training step each."""
    import os

    import torch.distributed as dist

    from rft_runtime.trainer.distributed import DistContext, ensure_group, full_state_dict, shard

    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"  # every tensor of the plain load made in this thread
    from rft_runtime.trainer.sharded_load import load_sharded

    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    ctx = DistContext(rank=rank, world_size=WORLD, port=port)
    ensure_group(ctx)
    from transformers import AutoModelForCausalLM

    with LiveTensorBytes() as plain_mem:
        plain = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype), ctx)
    with LiveTensorBytes() as sharded_mem:
        sharded = load_sharded(Path(model_dir), dtype, None, ctx)
    assert sharded is not None
    total, own, layer = _bound(sharded, WORLD)
    tied = sharded.get_output_embeddings().weight is sharded.get_input_embeddings().weight
    want, got = full_state_dict(plain), full_state_dict(sharded)
    buffers_equal = all(torch.equal(a, b) for a, b in zip(plain.buffers(), sharded.buffers()))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 200, (2, 12), generator=gen)
    rows = ids[rank:rank + 1]
    result = {"plain_losses": _step(plain, rows), "sharded_losses": _step(sharded, rows),
              "plain_peak": plain_mem.peak, "sharded_peak": sharded_mem.peak, "total": total, "shard": own,
              "layer": layer, "tied": tied, "buffers_equal": buffers_equal,
              "trained_equal": all(torch.equal(a, b) for a, b in zip(full_state_dict(plain).values(),
                                                                     full_state_dict(sharded).values()))}
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        torch.save({"want": want, "got": got}, Path(out) / "state.pt")
    dist.barrier()
    dist.destroy_process_group()


def _spawn(fn: Any, out: Path, *args: Any) -> None:
    mp.spawn(fn, nprocs=WORLD, join=True, args=(*args, str(out)))


@pytest.mark.parametrize("dtype,tol,tied,files,stored", [
    ("float64", 1e-6, True, None, torch.float32),
    ("float32", 1e-5, False, "40KB", torch.bfloat16),
], ids=["float64-tied-one-file", "float32-untied-indexed-bfloat16-files"])
def test_sharded_load_equals_plain_load(tmp_path, dtype, tol, tied, files, stored):
    """The checkpoint is stored in another dtype than the one trained in (as published checkpoints are in
    bfloat16): the plain load casts, so holds, the whole model on every rank; the sharded load casts slices."""
    model_dir = make_llama(tmp_path / "model", tied=tied, max_shard_size=files, stored=stored)
    assert (model_dir / "model.safetensors.index.json").exists() == bool(files)
    _spawn(load_both_rank, tmp_path, str(model_dir), free_port(), dtype)
    state = torch.load(tmp_path / "state.pt")
    assert state["got"].keys() == state["want"].keys()
    for k, v in state["want"].items():
        assert torch.equal(state["got"][k], v), k
    for rank in range(WORLD):
        r = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert r["tied"] is tied and r["buffers_equal"]
        plain, sharded = r["plain_losses"], r["sharded_losses"]
        assert abs(plain[1] - plain[0]) > 100 * tol  # the step changed the model: the comparison means something
        assert sharded == pytest.approx(plain, abs=tol)
        assert r["trained_equal"]
        # while loading: this rank's shard plus one layer's gathered parameters, never the whole model
        assert r["sharded_peak"] <= r["shard"] + r["layer"], r
        assert r["shard"] + r["layer"] < r["total"]  # the bound is below what the plain load holds ...
        assert r["plain_peak"] >= r["total"], r  # ... and the plain load does hold it


def test_loader_declines_what_it_does_not_read(tmp_path):
    """A world of one (``from_pretrained`` reads the whole model tensor by tensor already) and a model
    without safetensors weights load the plain way: the loader says None."""
    from rft_runtime.trainer.distributed import DistContext
    from rft_runtime.trainer.sharded_load import load_sharded, plan

    model_dir = make_llama(tmp_path / "model")
    assert load_sharded(model_dir, torch.float32, None, DistContext()) is None
    assert plan(model_dir).sources.keys() >= {"model.embed_tokens.weight", "model.norm.weight"}
    (model_dir / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    assert plan(model_dir) is None


def test_trainer_resumes_through_the_sharded_loader(tmp_path):
    """The trainer's :class:`Worker` at world size 2 (policy and KL reference loaded shard by shard) trains two
    steps; resumed from its distributed checkpoint of step 1 it ends where it did, and so does one process
    (a plain module loaded by ``from_pretrained``)."""
    from tests.trainer.test_distributed import ATOL, _assert_same, _train

    model_dir = make_llama(tmp_path / "model")
    two = _train(tmp_path, model_dir, 2, "ws2", steps=[1, 2], save_after=1)
    logs = "".join(p.read_text() for p in (tmp_path / "ws2").glob("rank-*.log"))
    assert logs.count("on the meta device and read this rank's shards") == 4, logs[-3000:]  # policy, reference
    start = make_llama(tmp_path / "again")  # the same seed: the same starting weights
    from transformers import AutoModelForCausalLM

    first = AutoModelForCausalLM.from_pretrained(start).state_dict()
    assert max(float((two[k] - first[k]).abs().max()) for k in two) > 100 * ATOL  # the steps moved it
    resumed = _train(tmp_path, model_dir, 2, "resumed", steps=[2], resume_from=tmp_path / "ws2" / "ckpt-1")
    for k, v in two.items():
        assert torch.equal(resumed[k], v), k
    _assert_same(_train(tmp_path, model_dir, 1, "ws1", steps=[1, 2]), two)


def warm_start_rank(rank: int, model_dir: str, warm: str, port: int, out: str) -> None:
    import torch.distributed as dist

    from rft_runtime.trainer.distributed import DistContext, ensure_group, full_state_dict
    from rft_runtime.trainer.sharded_load import load_sharded

    torch.set_num_threads(1)
    ctx = DistContext(rank=rank, world_size=WORLD, port=port)
    ensure_group(ctx)
    model = load_sharded(Path(model_dir), torch.float32, warm, ctx)
    assert model is not None
    sd = full_state_dict(model)
    if rank == 0:
        torch.save(sd, Path(out) / "state.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_a_warm_start_checkpoint_loads_shard_by_shard(tmp_path):
    """A warm start from one of our checkpoints (``weights.safetensors``, config from the model directory):
    its tensors first, the model directory's for any it lacks, as :func:`load_base` takes them."""
    from safetensors.torch import save_file

    from rft_runtime.trainer.model_io import load_base
    from rft_runtime.trainer.state import WEIGHTS_FILE

    model_dir = make_llama(tmp_path / "model")
    other = make_llama(tmp_path / "other", seed=1)
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(other).state_dict()
    warm = tmp_path / "ckpt"
    warm.mkdir()
    save_file({k: v.contiguous() for k, v in trained.items() if k.startswith("model.layers.")}, str(warm / WEIGHTS_FILE))
    _spawn(warm_start_rank, tmp_path, str(model_dir), str(warm), free_port())
    got = torch.load(tmp_path / "state.pt")
    want = load_base(model_dir, torch.float32, str(warm)).state_dict()
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    assert torch.equal(got["model.layers.0.mlp.up_proj.weight"], trained["model.layers.0.mlp.up_proj.weight"])
    assert not torch.equal(got["model.embed_tokens.weight"], trained["model.embed_tokens.weight"])
