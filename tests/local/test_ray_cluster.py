"""``rft run --address``: the roles run as actors of a Ray cluster that was already running.

The cluster is a real one-node Ray head (``ray start --head --block``) in its own session, with
Ray's token authentication on (a token file of the test's own, ``RAY_AUTH_TOKEN_PATH``, as a cluster
operator would hand it to its users); it is stopped by killing that session at the end (never ``ray
stop``, which would stop every Ray on the machine). Ray never takes loopback as a node's IP, so the
run sets ``RFT_BIND_HOST=127.0.0.1`` and every server of the roles binds and advertises loopback. The
run must attach to the cluster (not start a Ray of its own), train to the end, and leave the cluster
running for the next job.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import kill_session, rft_env, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path, monkeypatch):
    token = tmp_path / "ray-token"
    token.write_text(secrets.token_hex(32))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # for the head, `ray status` and the run alike
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rft-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    log = (tmp_path / "ray-head.log").open("wb")
    ray = str(Path(sys.executable).parent / "ray")
    p = subprocess.Popen(
        [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
         "--num-cpus", "4", "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp_dir],
        stdout=log, stderr=subprocess.STDOUT, env=rft_env(), start_new_session=True)
    address = f"127.0.0.1:{port}"

    def up() -> bool:
        r = subprocess.run([ray, "status", "--address", address], capture_output=True, text=True, env=rft_env())
        return r.returncode == 0

    try:
        wait_for(up, 120, "the Ray head to answer `ray status`", p)
        yield address
    finally:
        kill_session(p, 15)
        kill_session(p)
        log.close()
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
