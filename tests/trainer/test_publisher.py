"""Weight publication to the real builtin server: full weights and LoRA adapters (adapter only)
change what inference serves, and the served log-probs equal the trainer's."""

from __future__ import annotations

import httpx
import pytest
import torch

from rft_runtime.coordinator.server import AppThread
from rft_runtime.trainer.publisher import PublishError, WeightPublisher

PROMPT = [1, 120, 121, 122, 2, 1]


@pytest.fixture
def server(tiny_model_dir):
    from rft_runtime.serve.engine import Engine
    from rft_runtime.serve.model import load_model
    from rft_runtime.serve.server import create_app

    engine = Engine(load_model(str(tiny_model_dir)), max_batch_size=8)
    app = AppThread(create_app(engine, "m", stop_engine_on_cleanup=True)).start()
    try:
        yield f"http://127.0.0.1:{app.port}"
    finally:
        app.stop()


def _sample(url: str) -> tuple[list[int], list[float]]:
    r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0,
                                                 "seed": 7, "logprobs": 1, "return_token_ids": True,
                                                 "ignore_eos": True}, timeout=60)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _local_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        x = torch.tensor([PROMPT + ids])
        lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
        return [float(lp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(ids)]


def test_full_weights_publication_changes_outputs(server, tiny_model, tmp_path):
    ids0, lps0 = _sample(server)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
    pub = WeightPublisher(tmp_path / "weights", [server])
    path = pub.publish(tiny_model, 1)
    assert path.name == "v1" and (path / "model.safetensors").exists()
    assert httpx.get(server + "/get_policy_version").json()["policy_version"] == 1
    ids1, lps1 = _sample(server)
    assert lps1 != lps0
    torch.testing.assert_close(torch.tensor(lps1), torch.tensor(_local_logprobs(tiny_model, ids1)),
                               rtol=0, atol=1e-4)


def test_lora_adapter_only_publication(server, tiny_model, groups, tmp_path):
    from types import SimpleNamespace

    from rft_runtime.algos import compute_advantages
    from rft_runtime.trainer.batch import collate, sequences_from_groups
    from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer
    from rft_runtime.trainer.model_io import wrap_lora

    model = wrap_lora(tiny_model, SimpleNamespace(rank=4, alpha=16.0, dropout=0.0,
                                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    pub = WeightPublisher(tmp_path / "weights", [server])
    ids0, lps0 = _sample(server)
    # A fresh adapter (B = 0) is the base model: publishing it changes nothing.
    pub.publish(model, 1)
    assert _sample(server) == (ids0, lps0)
    # One LoRA training step with a large learning rate moves the adapter.
    seqs = sequences_from_groups(groups(2, 4))
    batch = collate(seqs)
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs]), [s.group for s in seqs])
    params = [p for p in model.parameters() if p.requires_grad]
    learner = Learner(model, LearnerConfig(micro_batch_size=8), build_optimizer(params, 0.05, 0.0))
    learner.update(batch, adv.advantages, adv.valid, learner.logprobs(batch))
    model.eval()
    path = pub.publish(model, 2)
    files = {p.name for p in path.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    assert httpx.get(server + "/get_policy_version").json()["policy_version"] == 2
    ids2, lps2 = _sample(server)
    assert lps2 != lps0
    torch.testing.assert_close(torch.tensor(lps2), torch.tensor(_local_logprobs(model, ids2)), rtol=0, atol=1e-4)
    assert [p.name for p in sorted((tmp_path / "weights").iterdir())] == ["v1", "v2"]


def test_refused_weights_fail_with_the_servers_message(server, tmp_path):
    pub = WeightPublisher(tmp_path / "weights", [server], deadline_s=5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PublishError, match="update_weights_from_disk"):
        pub.load(tmp_path / "empty", 3)


def test_inference_sync_reloads_a_server_that_lost_the_current_version(server, tiny_model, tiny_model_dir, tmp_path):
    from rft_runtime.trainer.inference_sync import InferenceSync

    pub = WeightPublisher(tmp_path / "weights", [server])
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    pub.publish(tiny_model, 3)
    trained = _sample(server)
    sync = InferenceSync(pub, lambda: 3)
    assert sync.check_once() == []  # in sync: nothing to do
    # What a restarted server looks like: base weights, version 0.
    httpx.post(server + "/update_weights_from_disk", json={"model_path": str(tiny_model_dir), "policy_version": 0},
               timeout=60).raise_for_status()
    assert pub.current_versions() == {server: 0} and _sample(server) != trained
    assert sync.check_once() == [server]
    assert sync.resynced == [(server, 0, 3)]
    assert pub.current_versions() == {server: 3} and _sample(server) == trained
    assert WeightPublisher(tmp_path / "w2", ["http://127.0.0.1:9"]).current_versions() == {"http://127.0.0.1:9": None}
