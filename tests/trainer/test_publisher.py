"""Weight publication to the real builtin server: full weights and LoRA adapters (adapter only)
change what inference serves, and the served log-probs equal the trainer's."""

from __future__ import annotations

import httpx
import pytest
import torch

from rft_runtime.trainer.publisher import PublishError, WeightPublisher
from tests.trainer.served_logprobs import builtin_server, local_logprobs, sample


@pytest.fixture
def server(tiny_model_dir):
    with builtin_server(tiny_model_dir, "m", max_batch_size=8) as url:
        yield url


def test_full_weights_publication_changes_outputs(server, tiny_model, tmp_path):
    ids0, lps0 = sample(server, "m")
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn_like(p) * 0.05, alpha=1.0)
    pub = WeightPublisher(tmp_path / "weights", [server])
    path = pub.publish(tiny_model, 1)
    assert path.name == "v1" and (path / "model.safetensors").exists()
    assert httpx.get(server + "/get_policy_version").json()["policy_version"] == 1
    ids1, lps1 = sample(server, "m")
    assert lps1 != lps0
    torch.testing.assert_close(torch.tensor(lps1), torch.tensor(local_logprobs(tiny_model, ids1)),
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
    ids0, lps0 = sample(server, "m")
    # A fresh adapter (B = 0) is the base model: publishing it changes nothing.
    pub.publish(model, 1)
    assert sample(server, "m") == (ids0, lps0)
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
    ids2, lps2 = sample(server, "m")
    assert lps2 != lps0
    torch.testing.assert_close(torch.tensor(lps2), torch.tensor(local_logprobs(model, ids2)), rtol=0, atol=1e-4)
    assert [p.name for p in sorted((tmp_path / "weights").iterdir())] == ["current.json", "v1", "v2"]


def test_publications_and_version_checks_build_no_tls_context(server, tiny_model, tmp_path, monkeypatch):
    """Each publication and each re-sync check opens a client; building httpx's default TLS context (the
    whole CA bundle, ~20 ms of CPU) each time cost every step that much. They share one per process."""
    import ssl

    from rft_runtime.timeouts import tls_context

    tls_context()  # built once, before counting
    built = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(1) or real(*a, **k))
    with httpx.Client() as probe:  # the counter sees what a client built without the shared context does
        probe.get(server + "/health")
    assert built == [1]
    pub = WeightPublisher(tmp_path / "weights", [server])
    for v in (1, 2):
        pub.publish(tiny_model, v)
        assert pub.current_versions() == {server: v}
    assert built == [1] and tls_context() is tls_context()


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
    trained = sample(server, "m")
    sync = InferenceSync(pub, lambda: 3)
    assert sync.check_once() == []  # in sync: nothing to do
    # What a restarted server looks like: base weights, version 0.
    httpx.post(server + "/update_weights_from_disk", json={"model_path": str(tiny_model_dir), "policy_version": 0},
               timeout=60).raise_for_status()
    assert pub.current_versions() == {server: 0} and sample(server, "m") != trained
    assert sync.check_once() == [server]
    assert sync.resynced == [(server, 0, 3)]
    assert pub.current_versions() == {server: 3} and sample(server, "m") == trained
    assert WeightPublisher(tmp_path / "w2", ["http://127.0.0.1:9"]).current_versions() == {"http://127.0.0.1:9": None}


def test_a_replica_that_drops_connection_attempts_costs_short_retries_not_the_kernels_minutes(tmp_path, monkeypatch):
    """A listener whose accept queue is full drops every SYN (as a network that has not yet admitted a
    new pod does): each attempt gives up after the connect limit and is retried within the deadline.
    Without the limit the first attempt would wait out the whole attempt timeout (here 120 s) alone."""
    import socket

    from rft_runtime import timeouts

    monkeypatch.setattr(timeouts, "CONNECT_S", 0.3)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    held = []
    try:
        for _ in range(4):  # fill the accept queue; nothing ever accepts
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(srv.getsockname())
            held.append(c)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        pub = WeightPublisher(tmp_path / "weights", [url], deadline_s=4.0, attempt_timeout_s=120.0)
        warnings: list[str] = []
        monkeypatch.setattr("rft_runtime.trainer.publisher.log.warning", lambda fmt, *a: warnings.append(fmt % a))
        with pytest.raises(PublishError, match=r"failed after \d+ attempts: ConnectTimeout"):
            pub.load_endpoint(url, tmp_path / "v1", 1)
        assert len(warnings) >= 2 and all("ConnectTimeout" in w for w in warnings), warnings
    finally:
        for c in held:
            c.close()
        srv.close()


def test_detached_state_is_not_changed_by_the_next_update_and_keeps_tied_weights_tied():
    from rft_runtime.trainer.publisher import detached_state

    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied, as a model with tie_word_embeddings
    frozen = torch.nn.Linear(5, 2)  # as a LoRA policy's base layer: no update changes it, so no copy
    frozen.requires_grad_(False)
    model.append(frozen)
    gathered = torch.ones(2)  # a tensor apart from the model (gathered from shards): not copied again
    state = detached_state({**model.state_dict(), "extra": gathered, "step": 3}, model)
    assert all(state[f"2.{n}"].data_ptr() == p.data_ptr() for n, p in model[2].named_parameters())
    before = state["0.weight"].clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)  # what the next optimiser step does in place
    assert torch.equal(state["0.weight"], before) and not torch.equal(model[0].weight, before)
    assert state["0.weight"] is state["1.weight"] and state["extra"] is gathered and state["step"] == 3


def test_a_background_publication_runs_one_at_a_time_and_its_error_reaches_the_trainer():
    import threading

    from rft_runtime.trainer.publisher import BackgroundPublication

    pub, gate, ran = BackgroundPublication(), threading.Event(), []
    pub.start(lambda v: (gate.wait(5), ran.append(v)), 1)
    assert pub.running
    with pytest.raises(RuntimeError, match="still running"):
        pub.start(ran.append, 2)
    gate.set()
    assert pub.wait() >= 0 and ran == [1] and not pub.running
    assert pub.wait() is None

    def refused(version):
        raise PublishError(f"http://inference: refused version {version}")

    pub.start(refused, 3)
    with pytest.raises(PublishError, match="refused version 3"):
        pub.wait()
    pub.start(refused, 4)
    pub.close()  # logs the error of a publication nobody waits for any more, and ends the thread
    assert not pub.running
    pub.close()
