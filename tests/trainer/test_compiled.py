"""``trainer.compile``: where the trainer compiles its decoder layers, what it refuses, and that a compiled
update is the eager one (TorchInductor's CPU backend here; the GPU numbers are in docs/trainer.md)."""

from __future__ import annotations

import logging
import re
import shutil

import pytest
import torch

from rft_runtime.trainer import compiled
from rft_runtime.trainer.compiled import CompileUnavailable, missing_toolchain, wants_compile

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(autouse=True)
def compile_config():
    """The process-wide settings :func:`wants_compile` makes, restored after each test."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    settings = ((inductor_config, "fx_graph_cache"), (functorch_config, "enable_autograd_cache"),
                (dynamo_config, "suppress_errors"))
    saved = [getattr(mod, name) for mod, name in settings]
    yield inductor_config, functorch_config, dynamo_config
    for (mod, name), value in zip(settings, saved):
        setattr(mod, name, value)


@pytest.fixture
def no_compilers(monkeypatch):
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)


def test_never_and_auto_on_the_cpu_do_not_compile():
    assert wants_compile("never", CPU) is False
    assert wants_compile("never", CUDA) is False
    assert wants_compile("auto", CPU) is False


def test_auto_compiles_on_a_gpu_where_the_toolchain_is_there(monkeypatch, compile_config):
    """Compiling turns Inductor's on-disk caches off (graphs loaded from them ran as slowly as eager on
    an H200); under auto a layer that fails to compile runs eager, under always the error stops the
    trainer."""
    inductor_config, functorch_config, dynamo_config = compile_config
    monkeypatch.setattr(compiled, "missing_toolchain", lambda device: None)
    assert wants_compile("auto", CUDA) is True
    assert (inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache) == (False, False)
    assert dynamo_config.suppress_errors is True
    assert wants_compile("always", CPU) is True
    assert dynamo_config.suppress_errors is False


def test_auto_without_a_compiler_trains_eager_and_says_why(no_compilers, caplog):
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert wants_compile("auto", CUDA) is False
    assert "trainer.compile: auto: not compiling on cuda: no C compiler" in caplog.text


@pytest.mark.parametrize("device,lacking", [(CUDA, "no C compiler"), (CPU, "no C++ compiler")])
def test_always_without_a_compiler_is_refused_naming_the_field(no_compilers, device, lacking):
    with pytest.raises(CompileUnavailable, match=re.escape(f"trainer.compile: always, but this {device.type} "
                                                           f"trainer cannot compile: {lacking}")):
        wants_compile("always", device)


def test_a_gpu_toolchain_needs_pythons_headers(monkeypatch, tmp_path):
    monkeypatch.setattr(compiled.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(compiled.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    assert f"no Python.h under {tmp_path}" in missing_toolchain(CUDA)
    (tmp_path / "Python.h").write_text("")
    assert missing_toolchain(CUDA) is None


def test_the_trainer_refuses_always_before_any_rank_starts(tmp_path, monkeypatch, capsys):
    from rft_api.job import validate_spec
    from rft_runtime.trainer import distributed
    from rft_runtime.trainer.main import main
    from tests.support.runtime_config import local_config

    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": {"builtin": "math"}, "trainer": {"compile": "always"}})
    cfg = local_config("j", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path, output=tmp_path)
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json())
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main(["--config", str(path)]) == 2
    lacking = {"cpu": "no C++ compiler", "cuda": "no C compiler"}[distributed.DistContext().device.type]
    assert f"rft trainer: InvalidConfig: trainer.compile: always, but this {distributed.DistContext().device.type} trainer " \
           f"cannot compile: {lacking}" in capsys.readouterr().err


def test_unset_is_auto_and_keeps_the_config_of_jobs_written_before_the_field():
    from rft_api.job import validate_spec

    base = {"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
            "evaluator": {"builtin": "math"}}
    spec = validate_spec(base)
    assert spec.trainer.compile is None
    assert "compile" not in spec.model_dump_json(by_alias=True, exclude_none=True)
    with pytest.raises(ValueError, match="trainer.compile"):
        validate_spec({**base, "trainer": {"compile": "sometimes"}})


@pytest.mark.skipif(missing_toolchain(CPU) is not None, reason="needs a C++ compiler for TorchInductor's CPU backend")
def test_a_compiled_update_is_the_eager_one(tiny_model_dir):
    """Two copies of one model, one with every decoder layer compiled, take the same GRPO update: the
    same loss and gradient norm and the same weights after it (float32; fused kernels round
    differently), and the compiled copy ran one graph for all its layers and every micro-batch width."""
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    from rft_runtime.algos import compute_advantages
    from rft_runtime.trainer import distributed
    from rft_runtime.trainer.batch import TrainSequence, collate
    from rft_runtime.trainer.learner import Learner, LearnerConfig, sequence_logprobs

    g = torch.Generator().manual_seed(0)
    seqs = [TrainSequence(group=f"t{i // 4}", prompt_ids=torch.randint(3, 200, (5 + i % 3,), generator=g).tolist(),
                          response_ids=torch.randint(3, 200, (2 + i,), generator=g).tolist(),
                          response_mask=[1] * (2 + i), inference_logprobs=[-1.0] * (2 + i),
                          reward=float(i % 3 == 0), version=0, truncated=False, episode_id=f"e{i}")
            for i in range(8)]
    batch = collate(seqs)
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs], dtype=torch.float64),
                             [s.group for s in seqs])
    torch._dynamo.reset()
    counters.clear()
    runs = []
    for compile_layers in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model = distributed.shard(model, distributed.DistContext(), None, compile_layers=compile_layers)
        learner = Learner(model, LearnerConfig(micro_batch_size=3), torch.optim.SGD(model.parameters(), lr=0.5))
        old = sequence_logprobs(model, batch, 1.0, 3)
        m = learner.update(batch, adv.advantages.float(), adv.valid, old)
        runs.append((old, m, {n: p.detach().clone() for n, p in model.named_parameters()}))
    (old0, m0, w0), (old1, m1, w1) = runs
    # one training graph and one no-gradient graph, shared by every layer and every micro-batch shape
    assert model.config.num_hidden_layers >= 2  # (micro-batches of 3, 3 and 2 rows, each its own width)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert torch.allclose(old1, old0, atol=1e-5, rtol=0)
    assert m0["grad_norm"] > 0
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-4, abs=1e-7)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-4)
    for n in w0:
        assert torch.allclose(w1[n], w0[n], atol=1e-5, rtol=1e-4), n


@pytest.mark.skipif(missing_toolchain(CPU) is not None, reason="needs a C++ compiler for TorchInductor's CPU backend")
def test_a_compiled_lora_policy_honours_its_adapter_switch(tiny_model_dir):
    """With ``model.lora`` the reference is the policy with its adapter disabled: compiled, the adapter's
    switch is honoured both ways (the logits with it on and off are the eager ones)."""
    from rft_api.job import validate_spec
    from rft_runtime.trainer import distributed
    from rft_runtime.trainer.model_io import load_policy

    spec = validate_spec({"model": {"base": str(tiny_model_dir), "lora": {"rank": 4}},
                          "dataset": {"train": {"builtin": "arithmetic"}}, "evaluator": {"builtin": "math"}})
    x = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    runs = []
    for compile_layers in (False, True):
        model = load_policy(spec.model, tiny_model_dir, 0, None)
        with torch.no_grad():  # lora_B starts at zero: give the adapter an effect
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        model = distributed.shard(model, distributed.DistContext(), None, compile_layers=compile_layers)
        with torch.no_grad():
            on = model(input_ids=x).logits
            with model.disable_adapter():
                off = model(input_ids=x).logits
            again = model(input_ids=x).logits
        runs.append((on, off, again))
    (on0, off0, _), (on1, off1, again1) = runs
    assert float((on0 - off0).abs().max()) > 0.1  # the adapter matters
    for got, want in ((on1, on0), (off1, off0), (again1, on0)):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
