"""Every inference replica on the current policy: the trainer publishes each version to every replica
its discovery lists (one address per ready pod), skips a replica that went away, points
``current.json`` at the version, and a replica that starts loads that version before it serves.

The replicas are real builtin servers on distinct loopback addresses (127.0.0.1, .2, .3) sharing one
port, as pods share the container port; the DNS lookup of the headless Service is the one seam
(``resolve``), since only the real node's CoreDNS has the Service (tests/e2e covers that path).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from rft_runtime.coordinator.server import AppThread
from rft_runtime.model.weights_files import current_published
from rft_runtime.serve.engine import Engine
from rft_runtime.serve.model import load_model
from rft_runtime.serve.server import create_app
from rft_runtime.trainer.inference_sync import InferenceSync
from rft_runtime.trainer.publisher import PublishError, WeightPublisher
from rft_runtime.trainer.replicas import InferenceReplicas, address_url, resolve_addresses
from tests.support.ports import free_port
from tests.trainer.served_logprobs import sample

SERVED = "m"
DISCOVER = "http://job-inference-pods.ns.svc:{port}"


@contextmanager
def replica(model_dir: Path, address: str, port: int, weights_dir: Path | None = None) -> Iterator[str]:
    """A builtin server on ``address:port`` (``weights_dir``: as ``rft serve --weights-dir``)."""
    engine = Engine(load_model(str(model_dir)), max_batch_size=4)
    app = AppThread(create_app(engine, SERVED, stop_engine_on_cleanup=True, weights_dir=weights_dir),
                    host=address, port=port).start()
    try:
        yield f"http://{address}:{port}"
    finally:
        app.stop()


def _version(url: str) -> int:
    return int(httpx.get(url + "/get_policy_version", timeout=10).json()["policy_version"])


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.fixture
def three(tiny_model_dir: Path) -> Iterator[tuple[list[str], int, ExitStack]]:
    port = free_port()
    with ExitStack() as stack:
        urls = [stack.enter_context(replica(tiny_model_dir, f"127.0.0.{i}", port)) for i in (1, 2, 3)]
        yield urls, port, stack


def test_each_version_reaches_every_listed_replica_then_current_json_names_it(three, tiny_model, tmp_path):
    urls, port, _ = three
    listed = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    replicas = InferenceReplicas([f"http://job-inference.ns.svc:{port}"], DISCOVER.format(port=port),
                                 resolve=lambda host, p: list(listed) if host == "job-inference-pods.ns.svc" else [])
    pub = WeightPublisher(tmp_path / "weights", replicas)
    before = [sample(u, SERVED) for u in urls]
    assert before[0] == before[1] == before[2]
    _perturb(tiny_model, 1)
    path = pub.publish(tiny_model, 1)
    assert [_version(u) for u in urls] == [1, 1, 1]
    after = [sample(u, SERVED) for u in urls]
    assert after[0] == after[1] == after[2] and after[0] != before[0]
    assert json.loads((tmp_path / "weights" / "current.json").read_text()) == {"policy_version": 1, "path": "v1"}
    assert current_published(tmp_path / "weights") == (1, path)


def test_a_replica_that_went_away_is_skipped_not_waited_for(three, tiny_model, tiny_model_dir, tmp_path):
    urls, port, stack = three
    listed = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    replicas = InferenceReplicas([], DISCOVER.format(port=port), resolve=lambda host, p: list(listed))
    # A deadline short enough that waiting for the dead replica would fail the publication.
    pub = WeightPublisher(tmp_path / "weights", replicas, deadline_s=20)
    pub.publish(tiny_model, 1)
    stack.close()  # every replica stops; two come back (new pods, base weights), the third stays deleted
    with ExitStack() as stack2:
        back = [stack2.enter_context(replica(tiny_model_dir, a, port)) for a in ("127.0.0.1", "127.0.0.2")]
        listed.remove("127.0.0.3")
        _perturb(tiny_model, 2)
        pub.publish(tiny_model, 2)
        assert [_version(u) for u in back] == [2, 2]
        assert json.loads((tmp_path / "weights" / "current.json").read_text())["policy_version"] == 2
        # listed but not answering: it is waited for, and the publication fails at its deadline naming it
        listed.append("127.0.0.3")
        short = WeightPublisher(tmp_path / "weights", replicas, deadline_s=2)
        with pytest.raises(PublishError, match=r"127\.0\.0\.3"):
            short.publish(tiny_model, 3)
        assert json.loads((tmp_path / "weights" / "current.json").read_text())["policy_version"] == 2


def test_a_replica_that_starts_serves_the_current_version_before_it_answers(tiny_model, tiny_model_dir, tmp_path):
    port = free_port()
    weights = tmp_path / "weights"
    with replica(tiny_model_dir, "127.0.0.1", port) as first:
        replicas = InferenceReplicas([first])
        _perturb(tiny_model, 3)
        pub = WeightPublisher(weights, replicas)
        pub.publish(tiny_model, 4)
        expected = sample(first, SERVED)
    with replica(tiny_model_dir, "127.0.0.2", port, weights_dir=weights) as late:
        assert _version(late) == 4
        assert sample(late, SERVED) == expected


def test_inference_sync_brings_a_newly_listed_replica_to_the_current_version(three, tiny_model, tmp_path):
    urls, port, _ = three
    listed = ["127.0.0.1", "127.0.0.2"]
    replicas = InferenceReplicas([], DISCOVER.format(port=port), resolve=lambda host, p: list(listed))
    pub = WeightPublisher(tmp_path / "weights", replicas)
    _perturb(tiny_model, 4)
    pub.publish(tiny_model, 1)
    assert [_version(u) for u in urls] == [1, 1, 0]
    sync = InferenceSync(pub, lambda: 1)
    assert sync.check_once() == []
    listed.append("127.0.0.3")  # a third replica turned Ready with the base weights
    assert sync.check_once() == [urls[2]]
    assert [_version(u) for u in urls] == [1, 1, 1]


def test_current_published_refuses_what_it_cannot_serve(tmp_path):
    weights = tmp_path / "weights"
    assert current_published(weights) is None  # nothing published yet
    weights.mkdir()
    (weights / "current.json").write_text("{not json")
    assert current_published(weights) is None
    (weights / "current.json").write_text(json.dumps({"policy_version": 3, "path": "v3"}))
    assert current_published(weights) is None  # pruned by a trainer that resumed earlier
    for bad in ({"policy_version": -1, "path": "v1"}, {"policy_version": 1, "path": "../v1"},
                {"policy_version": True, "path": "v1"}, [1]):
        (weights / "v1").mkdir(exist_ok=True)
        (weights / "current.json").write_text(json.dumps(bad))
        assert current_published(weights) is None, bad


def test_discovery_falls_back_to_the_service_and_resolves_for_real():
    replicas = InferenceReplicas(["http://svc:8000/"], "http://pods:8000", resolve=lambda host, port: [], wait_s=0.0)
    assert replicas.urls(wait=True) == ["http://svc:8000"]
    assert replicas.present("http://svc:8000")
    assert InferenceReplicas(["http://svc:8000"]).urls() == ["http://svc:8000"]
    v6 = InferenceReplicas([], "http://pods:9000", resolve=lambda host, port: ["fd00::5", "10.0.0.7"])
    assert v6.urls() == ["http://[fd00::5]:9000", "http://10.0.0.7:9000"]
    assert not v6.present("http://10.0.0.8:9000")
    assert address_url("http", "10.1.2.3", 80) == "http://10.1.2.3:80"
    # the real resolver (this machine's /etc/hosts and resolver library)
    assert "127.0.0.1" in resolve_addresses("localhost", 80)
    assert resolve_addresses("no-such-host.invalid", 80) == []


def test_a_publication_waits_for_discovery_to_list_a_replica_instead_of_the_service(tiny_model, tiny_model_dir,
                                                                                     tmp_path):
    """While no replica is Ready the publication asks the headless name again (every POLL_S) and
    publishes to the replica it lists, never through the Service (a connection to a Service without
    endpoints hangs until its connect timeout; here the Service's address answers nothing at all)."""
    port = free_port()
    asked: list[int] = []

    def resolve(host: str, p: int) -> list[str]:
        asked.append(1)
        return ["127.0.0.1"] if len(asked) > 4 else []  # the replica turns Ready at the fifth question
    service = f"http://127.0.0.9:{free_port()}"  # nothing listens there
    with replica(tiny_model_dir, "127.0.0.1", port) as url:
        replicas = InferenceReplicas([service], DISCOVER.format(port=port), resolve=resolve, wait_s=60)
        pub = WeightPublisher(tmp_path / "weights", replicas, deadline_s=5)
        assert pub.load(pub.save(tiny_model, 1), 1) == [url]
        assert _version(url) == 1 and len(asked) >= 5


def test_a_name_that_lists_nothing_is_waited_for_once_then_the_service_is_used(tiny_model, tiny_model_dir, tmp_path):
    """Discovery that never lists anything (no DNS for the headless name) costs one wait of ``wait_s``:
    the static URL serves, and later publications use it at once until the name lists a replica."""
    port = free_port()
    asked: list[int] = []
    listed: list[str] = []

    def resolve(host: str, p: int) -> list[str]:
        asked.append(1)
        return list(listed)
    with replica(tiny_model_dir, "127.0.0.1", port) as url:
        replicas = InferenceReplicas([url], DISCOVER.format(port=port), resolve=resolve, wait_s=0.6)
        pub = WeightPublisher(tmp_path / "weights", replicas)
        assert pub.load(pub.save(tiny_model, 1), 1) == [url]
        first = len(asked)
        assert first >= 3  # it waited, asking again
        assert pub.load(pub.save(tiny_model, 2), 2) == [url]
        assert len(asked) - first <= 2  # asked, not waited for (the publication's present() may ask once)
        listed.append("127.0.0.1")  # the name works now: it is listed, and waited for again next time
        assert replicas.urls(wait=True) == [url] and not replicas._never_listed


def test_asked_without_waiting_a_name_that_lists_none_gives_no_replica_not_the_service():
    """The re-sync check asks without waiting while holding the lock a publication needs: with no
    replica Ready it gets none (the Service would hang until its connect timeout), not the static
    URL; once a wait found that the name lists nothing at all (no DNS for it), the static URL."""
    listed: list[str] = []
    replicas = InferenceReplicas(["http://svc:8000"], "http://pods:8000", resolve=lambda h, p: list(listed),
                                 wait_s=0.3)
    assert replicas.urls() == []
    listed.append("10.0.0.7")
    assert replicas.urls() == ["http://10.0.0.7:8000"]
    listed.clear()
    assert replicas.urls() == []
    assert replicas.urls(wait=True) == ["http://svc:8000"]  # a whole wait listed nothing
    assert replicas.urls() == ["http://svc:8000"]
    assert InferenceReplicas(["http://svc:8000"]).urls() == ["http://svc:8000"]  # no discovery: static
