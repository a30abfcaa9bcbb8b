"""trainer.gradientCheckpointing: every decoder layer recomputes its activations in the backward, and the
loss and gradients equal the plain path's (1e-6 in float64, 1e-5 in float32)."""

from __future__ import annotations

import pytest
import torch

from rft_runtime.algos import compute_advantages
from rft_runtime.trainer.batch import collate, sequences_from_groups
from rft_runtime.trainer.checkpointing import CheckpointingUnsupported, checkpointed, enable
from rft_runtime.trainer.learner import Learner, LearnerConfig, sequence_logprobs


def _inputs(groups):
    seqs = sequences_from_groups(groups(3, 4, steps=1))
    batch = collate(seqs)
    rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
    return batch, compute_advantages("grpo", rewards, [s.group for s in seqs])


def step(model_dir, batch, adv, dtype, **cfg):
    """One update with SGD at learning rate 1 (the weights move by minus the gradient): (loss, the
    gradient of every parameter, how many times the first decoder layer's MLP ran)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    calls = []
    model.model.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    learner = Learner(model, LearnerConfig(micro_batch_size=4, grad_clip=1e9, **cfg),
                      torch.optim.SGD(model.parameters(), lr=1.0))
    old = sequence_logprobs(model, batch, 1.0, 4).to(dtype)
    old = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    calls.clear()
    m = learner.update(batch, adv.advantages.to(dtype), adv.valid, old)
    grads = {n: before[n] - p.detach() for n, p in model.named_parameters()}
    return m["loss"], grads, len(calls), model


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
def test_loss_and_gradients_equal_the_plain_path(tiny_model_dir, groups, dtype, tol):
    batch, adv = _inputs(groups)
    loss0, g0, calls0, plain = step(tiny_model_dir, batch, adv, dtype)
    loss1, g1, calls1, ckpt = step(tiny_model_dir, batch, adv, dtype, gradient_checkpointing=True)
    assert checkpointed(ckpt) and not checkpointed(plain)
    assert calls1 == 2 * calls0 > 0  # every micro-batch's layer ran again in the backward
    assert loss1 == pytest.approx(loss0, rel=tol, abs=tol)
    assert any(g.abs().max() > 0 for g in g0.values())
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=tol, atol=tol, msg=n)


def test_lora_model_checkpoints_its_base_layers(tiny_model, groups):
    from rft_api.spec import LoraSpec
    from rft_runtime.trainer.model_io import wrap_lora

    model = wrap_lora(tiny_model, LoraSpec(rank=4))
    assert enable(model) == 2 and checkpointed(model)
    batch, adv = _inputs(groups)
    learner = Learner(model, LearnerConfig(micro_batch_size=4), torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=1e-2))
    m = learner.update(batch, adv.advantages.float(), adv.valid, learner.logprobs(batch))
    assert m["grad_norm"] > 0


def test_a_model_without_checkpointable_layers_is_refused_naming_the_field():
    with pytest.raises(CheckpointingUnsupported, match="trainer.gradientCheckpointing"):
        Learner(torch.nn.Linear(2, 2), LearnerConfig(gradient_checkpointing=True),
                torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0))


def test_the_spec_fields_reach_the_learner():
    from rft_api.job import parse_manifest
    from rft_api.presets import resolve_algorithm
    from rft_runtime.trainer.learner import learner_config

    doc = {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": "x"},
           "spec": {"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic", "size": 16}},
                    "evaluator": {"builtin": "math"}, "trainer": {"gradientCheckpointing": True}}}
    spec = parse_manifest(doc).spec
    assert learner_config(resolve_algorithm(spec), spec).gradient_checkpointing is True
    doc["spec"]["trainer"] = {"sequencePacking": True}
    spec = parse_manifest(doc).spec
    assert learner_config(resolve_algorithm(spec), spec).sequence_packing is True
    spec = parse_manifest({**doc, "spec": {**doc["spec"], "trainer": {}}}).spec
    assert spec.trainer.gradient_checkpointing is None
    assert learner_config(resolve_algorithm(spec), spec).gradient_checkpointing is False
    assert learner_config(resolve_algorithm(spec), spec).sequence_packing is False
