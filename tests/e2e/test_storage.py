"""Models and data from object storage and a model hub on the real node: a real S3 server (SeaweedFS)
and a hub-compatible server (olah) on the node's own network. The job's model (the tiny model's files)
and GSM8K (a field mapping) under ``s3://``, fetched once by the fetch Job, trained, and the final model
pushed back to ``s3://`` and read byte for byte; a second job from ``hf://`` (model and dataset
repositories); a job whose secret is wrong ends Failed with a condition naming the URI and the 403, no
restart spent, and the secret in no status, event or log."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator

import pytest

from rft_operator import names
from tests.e2e.stack import JobDriver
from tests.support.hubserver import HubServer
from tests.support.s3server import S3Server
from tests.support.shared import shared_dir

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]
START_S = 300.0


@pytest.fixture
def node_s3(driver: JobDriver) -> Iterator[S3Server]:
    """SeaweedFS in the node's network namespace, on the node's own address (the pods reach it there;
    the test reaches it over the node's veth)."""
    net = driver.node.net
    with S3Server(host=net.node_ip, wrap=net.nsenter()) as server:
        yield server


def _tiny_model_files() -> dict[str, bytes]:
    from rft_runtime.model import resolve_builtin_model

    model = resolve_builtin_model("builtin:tiny")
    return {f.relative_to(model).as_posix(): f.read_bytes() for f in sorted(model.rglob("*")) if f.is_file()}


def _gsm8k_lines(n: int) -> list[str]:
    return (shared_dir() / "datasets" / "gsm8k" / "train.jsonl").read_text().splitlines()[:n]


def _stage(server: S3Server, bucket: str) -> list[str]:
    s3 = server.client()
    s3.create_bucket(Bucket=bucket)
    keys = []
    for rel, data in _tiny_model_files().items():
        keys.append(f"models/tiny/{rel}")
        s3.put_object(Bucket=bucket, Key=keys[-1], Body=data)
    lines = _gsm8k_lines(32)
    s3.put_object(Bucket=bucket, Key="data/gsm8k/train.jsonl", Body=("\n".join(lines) + "\n").encode())
    return keys + ["data/gsm8k/train.jsonl"]


def _docs(name: str, server: S3Server, bucket: str, secret: str) -> list[dict]:
    creds = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-s3"}, "type": "Opaque",
             "data": {"id": base64.b64encode(server.access_key.encode()).decode(),
                      "secret": base64.b64encode(secret.encode()).decode()}}
    job = {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": name}, "spec": {
        "model": {"base": f"s3://{bucket}/models/tiny"},
        "dataset": {"train": {"uri": f"s3://{bucket}/data/gsm8k/train.jsonl", "size": 8,
                              "fields": {"prompt": "question", "groundTruth": "answer"}}},
        "evaluator": {"builtin": "math"},
        "rollout": {"samplesPerPrompt": 4, "promptsPerStep": 4, "maxTokens": 8},
        "inference": {"engine": "builtin"},
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": 2},
        "checkpoint": {"everySteps": 2},
        "storage": {"s3": {"endpoint": server.endpoint, "region": server.region,
                           "accessKeyIdSecretRef": {"name": f"{name}-s3", "key": "id"},
                           "secretAccessKeySecretRef": {"name": f"{name}-s3", "key": "secret"}}},
        "output": {"uri": f"s3://{bucket}/trained/{name}"},
    }}
    return [creds, job]


@pytest.mark.timeout(1800)
def test_a_job_from_s3_is_fetched_once_trains_and_pushes_its_model(driver: JobDriver, node_s3: S3Server) -> None:
    bucket = f"e2e-{uuid.uuid4().hex[:8]}"
    staged = _stage(node_s3, bucket)
    job = "from-s3"
    driver.apply_docs(_docs(job, node_s3, bucket, node_s3.secret_key))
    st = driver.wait_phase(job, "Succeeded", 1200)
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["InputsReady"]["status"] == "True" and conds["InputsReady"]["reason"] == "Fetched", conds
    assert f"s3://{bucket}/models/tiny" in conds["InputsReady"]["message"]
    assert conds["OutputPushed"]["status"] == "True", conds["OutputPushed"]
    assert st["output"]["uri"] == f"s3://{bucket}/trained/{job}/final", st["output"]
    assert st["restarts"] == 0

    # the final model on the claim and in the bucket, byte for byte
    final = driver.checkpoint_dir(job) / st["finalModel"]["path"]
    local = sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file())
    assert "config.json" in local and st["output"]["files"] == len(local)
    s3 = node_s3.client()
    for rel in local:
        assert s3.get_object(Bucket=bucket, Key=f"trained/{job}/final/{rel}")["Body"].read() == (final / rel).read_bytes()
    # fetched once by the fetch Job: inference, rollout and trainer pods read the claim's copy
    assert {k: node_s3.get_object_count(bucket, k) for k in staged} == {k: 1 for k in staged}
    assert any(k[0] == "Job" and k[1].startswith(names.fetch_prefix(job)) for k in driver.children(job))
    texts = [str(driver.job(job)), driver.platform.operator_logs(), driver.role_logs(job, "trainer"),
             driver.role_logs(job, "fetch")]
    assert not [t for t in texts if node_s3.secret_key in t]


@pytest.mark.timeout(900)
def test_a_wrong_secret_fails_the_job_naming_the_uri_and_the_403(driver: JobDriver, node_s3: S3Server) -> None:
    bucket = f"e2e-{uuid.uuid4().hex[:8]}"
    _stage(node_s3, bucket)
    job, wrong = "wrong-s3", "WRONG-" + uuid.uuid4().hex
    driver.apply_docs(_docs(job, node_s3, bucket, wrong))
    st = driver.wait_phase(job, "Failed", START_S)
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert failed["reason"] == "FetchFailed", failed
    assert f"s3://{bucket}/models/tiny" in failed["message"] and "403" in failed["message"], failed
    assert st["restarts"] == 0
    kids = driver.children(job)
    assert ("Job", names.trainer(job)) not in kids and not any(k[0] == "Deployment" for k in kids)
    events = driver.kubectl("get", "events", "--field-selector", f"involvedObject.name={job}", "-o", "yaml").stdout
    for text in (str(driver.job(job)), events, driver.platform.operator_logs(), driver.role_logs(job, "fetch")):
        assert wrong not in text
    assert [k for k in node_s3.requests(bucket) if k.method == "GET" and k.key and k.status == 200] == []


@pytest.mark.timeout(1200)
def test_a_job_from_hub_repositories_trains(driver: JobDriver, tmp_path_factory: pytest.TempPathFactory) -> None:
    net = driver.node.net
    with HubServer(tmp_path_factory.mktemp("hub"), host=net.node_ip, wrap=net.nsenter()) as hub:
        files = _tiny_model_files()
        sha = hub.add_model_repo("rft-e2e/tiny", files)
        hub.add_dataset_repo("rft-e2e/gsm8k", {"README.md": b"# sample\n",
                                                "main/train.jsonl": ("\n".join(_gsm8k_lines(16)) + "\n").encode()})
        job = "from-hf"
        fields = {"prompt": "question", "groundTruth": "answer"}
        driver.apply_docs([{"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": job}, "spec": {
            "model": {"base": "hf://rft-e2e/tiny@main"},
            "dataset": {"train": {"uri": "hf://datasets/rft-e2e/gsm8k", "config": "main", "size": 8, "fields": fields}},
            "evaluator": {"builtin": "math"},
            "rollout": {"samplesPerPrompt": 4, "promptsPerStep": 4, "maxTokens": 8},
            "inference": {"engine": "builtin"},
            "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": 2},
            "checkpoint": {"everySteps": 2},
            "storage": {"huggingFace": {"endpoint": hub.endpoint}},
        }}])
        st = driver.wait_phase(job, "Succeeded", 1000)
        inputs = {c["type"]: c for c in st["conditions"]}["InputsReady"]
        assert inputs["reason"] == "Fetched" and sha[:12] in inputs["message"], inputs
        assert all(hub.download_count("rft-e2e/tiny", rel) == 1 for rel in files)
        assert hub.download_count("rft-e2e/gsm8k", "main/train.jsonl", "dataset") == 1
