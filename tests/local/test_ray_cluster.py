"""``rft run --address``: the roles run as actors of a Ray cluster that was already running.

Two clusters: a one-node head on which the roles share the driver's filesystem, and a head plus a
worker node whose roles cannot see the driver's files (``two_node_cluster``). Each node is a real
``ray start --block`` in its own session, with Ray's token authentication on (a token file of the
test's own, ``RAY_AUTH_TOKEN_PATH``, as a cluster operator would hand it to its users); it is
stopped by killing that session at the end (never ``ray stop``, which would stop every Ray on the
machine). Ray never takes loopback as a node's IP, so the runs set ``RFT_BIND_HOST=127.0.0.1`` and
every server of the roles binds and advertises loopback. A run must attach to the cluster (not start
a Ray of its own), train to the end, and leave the cluster running for the next job.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.polling import wait_for
from tests.support.ports import free_port

from .conftest import kill_session, rft_env


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


def _start_head(log: Path, temp_dir: str, *, num_cpus: int, client_port: int | None = None) -> tuple[subprocess.Popen, str]:
    """``ray start --head --block`` on loopback in its own session; returns (process, address) once
    ``ray status`` answers."""
    port = free_port()
    args = [_ray(), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
            "--num-cpus", str(num_cpus), "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp_dir]
    if client_port is not None:
        args += ["--ray-client-server-port", str(client_port)]
    # The Ray Client server starts a server process per client and gives it 30 s to answer by default:
    # too little for a 2-core machine running a test suite (a CI run saw it give up). Not much more:
    # when that process dies at birth (ray-project/ray#63202) the proxier waits all of it out before
    # `rft run` connects again (a CI run spent 300 s there).
    env = {**rft_env(), "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "120"}
    with log.open("wb") as f:
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"127.0.0.1:{port}"
    wait_for("the Ray head to answer `ray status`", lambda: _nodes_alive(address) >= 1, 120, proc=p)
    return p, address


def _nodes_alive(address: str) -> int:
    r = subprocess.run([_ray(), "status", "--address", address], capture_output=True, text=True, env=rft_env())
    if r.returncode != 0:
        return 0
    # `ray status` lists each active node as " 1 node_<id>" under "Active:"
    return sum(1 for line in r.stdout.splitlines() if line.strip().split(" ")[-1].startswith("node_"))


def _stop(p: subprocess.Popen) -> None:
    kill_session(p, 15)
    kill_session(p)


@pytest.fixture
def ray_auth(tmp_path, monkeypatch):
    """Ray's token authentication on, for the nodes, ``ray status`` and the runs alike (a token file
    of the test's own, ``RAY_AUTH_TOKEN_PATH``, as a cluster operator would hand it to its users)."""
    d = Path(tempfile.mkdtemp(prefix="rft-ray-auth-", dir="/tmp"))
    (d / "token").write_text(secrets.token_hex(32))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(d / "token"))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    yield
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ray_head(tmp_path, ray_auth):
    temp_dir = tempfile.mkdtemp(prefix="rft-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    p, address = _start_head(tmp_path / "ray-head.log", temp_dir, num_cpus=4)
    try:
        yield address
    finally:
        _stop(p)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_rft_run_attaches_to_a_running_ray_cluster(tmp_path, tiny_model, manifest, rft, ray_head, monkeypatch):
    """Two jobs on one cluster: the first names the head (``--address HOST:PORT``), the second finds it
    in ``$RAY_ADDRESS``, the way a user points every Ray program at a cluster."""
    monkeypatch.setenv("RFT_BIND_HOST", "127.0.0.1")
    job = manifest("on-ray", trainer={"maxSteps": 4}, checkpoint={"everySteps": 2})
    for run, address in (("first", ray_head), ("second", ray_head)):  # the cluster outlives a job
        out = tmp_path / run
        log = tmp_path / f"{run}.log"
        args = ["run", str(job), "--out", str(out), "--no-progress"]
        if run == "first":
            args += ["--address", address]
        else:
            monkeypatch.setenv("RAY_ADDRESS", address)
        code = rft.run(args, log)
        text = log.read_text()
        assert code == 0, text[-4000:]
        assert f"attached to the Ray cluster at {address}: 1 node(s), 4 CPUs" in text
        assert [r["step"] for r in rft.rows(out)] == [1, 2, 3, 4], text[-2000:]
        assert (out / "checkpoints" / "latest").read_text().strip() == "step-000004"
        config = json.loads((out / "config.json").read_text())
        urls = [*config["endpoints"]["inference"], config["endpoints"]["coordinator"]]
        assert all(u.startswith("http://127.0.0.1:") for u in urls), urls  # the node's own address


MULTINODE_MANIFEST = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: far-files}
data:
  tasks.jsonl: |
%(tasks)s
  closeness.py: |
    import re

    def score(sample, item):
        numbers = re.findall(r"-?\\\\d+", sample.text)
        if not numbers:
            return 0.0
        guess, truth = int(numbers[-1]), int(str(item.ground_truth))
        return max(0.0, 1.0 - abs(guess - truth) / 10)
---
apiVersion: rft.dev/v1alpha1
kind: RFTJob
metadata: {name: far-away}
spec:
  model: {base: "builtin:tiny"}
  dataset: {train: {configMapKeyRef: {name: far-files, key: tasks.jsonl}}}
  evaluator: {file: {configMapKeyRef: {name: far-files, key: closeness.py}, function: score}}
  rollout: {samplesPerPrompt: 4, promptsPerStep: 4, temperature: 1.0, maxTokens: 8}
  inference: {engine: builtin, replicas: 2}
  trainer: {algorithm: grpo, learningRate: 2.0e-3, maxSteps: 4, seed: 0}
  checkpoint: {everySteps: 2, keepLast: 1}
"""


def _multinode_manifest(path: Path) -> Path:
    rows = [json.dumps({"task_id": f"add-{a}-{b}", "prompt": f"What is {a} + {b}?", "ground_truth": str(a + b)})
            for a, b in ((1, 2), (3, 4), (5, 1), (2, 6), (4, 4), (7, 1))]
    path.write_text(MULTINODE_MANIFEST % {"tasks": "\n".join("    " + r for r in rows)})
    return path


@pytest.fixture
def two_node_cluster(tmp_path, tiny_model, ray_auth):
    """A Ray head with no CPUs (as production clusters keep theirs: the driver attaches there, no
    role runs there) and a worker node with 8 CPUs, started by ``ray start`` in a mount namespace of
    its own where the test's directory (``--out``, the manifest, the files placed from its
    ConfigMaps) and the model cache are empty tmpfs mounts: nothing of the driver's reaches the
    worker's roles by path. The worker refuses to start when it can still see the model. Yields
    (GCS address, Ray Client address, the worker's stage directory)."""
    temp_dir = tempfile.mkdtemp(prefix="rft-ray-", dir="/tmp")
    stage = Path(tempfile.mkdtemp(prefix="rft-stage-", dir="/tmp"))
    client_port = free_port()
    head, address = _start_head(tmp_path / "ray-head.log", temp_dir, num_cpus=0, client_port=client_port)
    hidden = [str(tmp_path), str(tiny_model.parent)]
    script = ('set -e; for d in "$@"; do mount -t tmpfs -o size=1m rft-hidden "$d"; done; '
              f'test ! -e {tiny_model}/config.json; '
              f'exec {_ray()} start --block --address {address} --node-ip-address 127.0.0.1 --num-cpus 8 '
              '--disable-usage-stats')
    env = {**rft_env(), "RFT_STAGE_DIR": str(stage)}
    with (tmp_path / "ray-worker.log").open("wb") as f:  # opened before the namespace hides tmp_path
        worker = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *hidden],
                                  stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for("the worker node to join", lambda: _nodes_alive(address) >= 2, 120, proc=worker)
        yield address, f"ray://127.0.0.1:{client_port}", stage
    finally:
        _stop(worker)
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)


def test_rft_run_on_two_ray_nodes_without_a_shared_filesystem(tmp_path, rft, two_node_cluster, monkeypatch):
    """Every role runs on the worker node, which cannot see the driver's files. The model, the
    dataset and the evaluator file reach the roles through the object store, each policy version
    reaches both inference replicas over HTTP, and the trainer's checkpoints, metrics and final model
    and every role's log come back into ``--out`` on the driver's side. A job that fails on the worker
    gets its logs back too. A third job resumes the first from ``--out`` alone, through Ray Client
    (``ray://``), with each replica's engine in a process of its own, and the worker keeps nothing."""
    address, client, stage = two_node_cluster
    monkeypatch.setenv("RFT_BIND_HOST", "127.0.0.1")
    # inputs travel in pieces of 64 KiB (64 MiB by default), so the resumed run's checkpoints take many
    monkeypatch.setenv("RFT_STAGE_PIECE_BYTES", str(64 << 10))
    job = _multinode_manifest(tmp_path / "far.yaml")
    out = tmp_path / "out"

    log = tmp_path / "first.log"
    code = rft.run(["run", str(job), "--out", str(out), "--no-progress", "--address", address, "--max-steps", "2"], log)
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert f"attached to the Ray cluster at {address}: 2 node(s), 8 CPUs" in text
    assert [r["step"] for r in rft.rows(out)] == [1, 2]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert (out / "checkpoints" / "step-000002" / "COMPLETE").exists()  # the marker travels with the files
    for name in ("trainer.log", "inference-0.log", "inference-1.log", "rollout-0.log"):
        assert (out / "logs" / name).stat().st_size > 0, name  # written on the worker, copied back
    for name in ("inference-0.log", "inference-1.log"):
        assert "serving policy version 2 (full weights)" in (out / "logs" / name).read_text(), name
    trainer_log = (out / "logs" / "trainer.log").read_text()
    assert "policy version 2 served by 2 inference replica(s)" in trainer_log, trainer_log[-3000:]
    assert not any(stage.iterdir()), sorted(stage.iterdir())  # the worker's copies are gone

    # A job whose evaluator file is broken fails on the worker; the error reaches the driver and the
    # roles' logs come back all the same.
    broken = tmp_path / "broken.yaml"
    broken.write_text(job.read_text().replace("    def score(sample, item):", "    def score(sample, item:"))
    log = tmp_path / "broken.log"
    code = rft.run(["run", str(broken), "--out", str(tmp_path / "broken"), "--no-progress", "--address", address], log)
    text = log.read_text()
    assert code == 2 and "SyntaxError" in text and "Traceback" not in text, text[-3000:]
    # the message names the file the user gave (placed from the ConfigMap), not the worker's copy
    assert str(tmp_path / "broken" / "mounts" / "evaluator" / "0" / "closeness.py") in text, text[-3000:]
    assert "rft-run-" not in text
    assert "serving policy version 0" in (tmp_path / "broken" / "logs" / "inference-0.log").read_text()
    assert (tmp_path / "broken" / "logs" / "trainer.log").stat().st_size > 0
    assert not any(stage.iterdir()), sorted(stage.iterdir())

    # the resumed run also puts each replica's engine in a process of its own, spawned by its actor on
    # the worker node: the child loads the staged model (the worker's copy) and serves every version
    log = tmp_path / "second.log"
    code = rft.run(["run", str(job), "--out", str(out), "--no-progress", "--address", client, "--resume",
                    "--engine-process"], log)
    text = log.read_text()
    assert code == 0, text[-4000:]
    for name in ("inference-0.log", "inference-1.log"):
        replica = (out / "logs" / name).read_text()
        assert len(re.findall(r"\[engine\]: engine process \d+ \(parent \d+\)", replica)) == 1, replica[-3000:]
        assert "serving policy version 4 (full weights)" in replica, replica[-3000:]
    shipped = re.search(r"inputs in the object store: (\d+) archive\(s\), ([\d.]+) MiB in (\d+) piece\(s\) "
                        r"of at most 0\.0625 MiB", text)
    assert shipped, text[-3000:]
    archives, mib, pieces = int(shipped[1]), float(shipped[2]), int(shipped[3])
    assert pieces >= (mib - 0.05) * 16 > archives, shipped[0]  # many pieces each, and they arrived whole
    assert [r["step"] for r in rft.rows(out)] == [1, 2, 3, 4]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000004"
    assert not (out / "checkpoints" / "step-000002").exists()  # pruned by the trainer (keepLast 1), here too
    final = out / "checkpoints" / "final"
    assert (final / "config.json").exists() and list(final.glob("*.safetensors")), sorted(final.iterdir())
    assert "(step 2, policy version 2)" in (out / "logs" / "trainer.log").read_text()  # resumed from --out
    assert not (out / "checkpoints" / "weights").exists()  # the published versions stay with inference
    assert not any(stage.iterdir()), sorted(stage.iterdir())


@pytest.mark.parametrize("address, attempts_made", [("ray://127.0.0.1:1", 2), ("127.0.0.1:1", 1)])
def test_a_ray_client_session_the_server_failed_to_start_is_tried_again(monkeypatch, address, attempts_made):
    """Ray Client's proxier now and then loses the server it starts for a session (ray-project/ray#63202:
    ``ConnectionAbortedError: Initialization failure from server``, seen in the test above); it cannot be
    caused on demand, so ``ray.init`` fails once here. A ``ray://`` connection is tried again; the same
    error from a cluster address is not (it is no client session) and reaches the user."""
    import ray

    from rft_runtime.local import runner

    calls: list[str] = []

    def init(address: str, **kwargs) -> None:
        calls.append(address)
        if len(calls) == 1:
            raise ConnectionAbortedError("Initialization failure from server:\npsutil.ZombieProcess: zombie")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    if attempts_made == 1:
        with pytest.raises(ConnectionAbortedError):
            runner._attach_ray(address, {})
    else:
        runner._attach_ray(address, {})
    assert calls == [address] * attempts_made


def test_a_bad_piece_size_is_refused_naming_it_before_ray_starts(tmp_path, manifest, rft, monkeypatch):
    """``$RFT_STAGE_PIECE_BYTES`` that is no positive number of bytes ends ``rft run --address`` with a
    message naming it, before it attaches to anything (the address answers nothing)."""
    monkeypatch.setenv("RFT_STAGE_PIECE_BYTES", "64M")
    log = tmp_path / "run.log"
    code = rft.run(["run", str(manifest()), "--out", str(tmp_path / "out"), "--no-progress",
                    "--address", "127.0.0.1:1"], log, timeout=120)
    text = log.read_text()
    assert code == 2, text[-3000:]
    assert "rft run: $RFT_STAGE_PIECE_BYTES must be a positive whole number of bytes, not '64M'" in text, text[-3000:]
    assert "Traceback" not in text and "attached" not in text, text[-3000:]


def test_a_ray_cluster_without_authentication_is_refused(tmp_path, manifest, rft, monkeypatch):
    """A head started with RAY_AUTH_MODE=disabled: ``rft run --address`` attaches, asks the cluster's own
    workers how their nodes authenticate, and stops before any role starts, naming the remedy
    (``--allow-unauthenticated-ray`` or a cluster with token authentication)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = tempfile.mkdtemp(prefix="rft-ray-", dir="/tmp")
    p, address = _start_head(tmp_path / "ray-head.log", temp_dir, num_cpus=2)
    try:
        log = tmp_path / "run.log"
        code = rft.run(["run", str(manifest()), "--out", str(tmp_path / "out"), "--no-progress", "--address", address],
                       log, timeout=300)
        text = log.read_text()
        assert code == 2, text[-3000:]
        assert f"rft run: the Ray cluster at {address} runs without authentication (RAY_AUTH_MODE=disabled on its " \
               "nodes)" in text and "--allow-unauthenticated-ray" in text, text[-3000:]
        assert "Traceback" not in text and not (tmp_path / "out" / "metrics.jsonl").exists(), text[-3000:]
    finally:
        _stop(p)
        shutil.rmtree(temp_dir, ignore_errors=True)
