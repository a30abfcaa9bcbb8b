"""The disk a machine needs stays bounded over many runs: hack/cached-venv.sh's prune_stale keeps the
newest superseded venv of a kind and no other, and hack/reclaim.sh removes an earlier session's node
images and container filesystems, but not those of a node whose containerd still runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _venv(path: Path, age_s: float) -> None:
    (path / "bin").mkdir(parents=True)
    (path / ".complete").touch()
    t = time.time() - age_s
    os.utime(path, (t, t))


def test_prune_stale_keeps_the_newest_superseded_venv_of_its_kind(tmp_path: Path) -> None:
    for i, age in enumerate([400, 300, 200]):
        _venv(tmp_path / f"vllm-0.9.{i}-abc{i}", age)
    _venv(tmp_path / "trl-1.0-k", 500)  # another kind: not touched
    (tmp_path / "vllm-notes.txt").write_text("a file, not a venv")
    new = tmp_path / "vllm-0.10.0-new"
    r = subprocess.run(["bash", "-c", f'. "{ROOT}/hack/cached-venv.sh" && prune_stale "$1" "$2"', "_",
                        str(new), str(tmp_path / "vllm")], capture_output=True, text=True, check=True)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["trl-1.0-k", "vllm-0.9.2-abc2", "vllm-notes.txt"], (left, r.stderr)
    assert r.stderr.count("removing") == 2


@pytest.mark.skipif(subprocess.run(["which", "pgrep"], capture_output=True).returncode != 0, reason="no pgrep")
def test_reclaim_removes_earlier_sessions_node_images_but_not_a_running_nodes(tmp_path: Path) -> None:
    base = tmp_path / f"pytest-of-{subprocess.run(['id', '-un'], capture_output=True, text=True).stdout.strip()}"
    old = base / "pytest-7" / "cluster0" / "node"
    live = base / "pytest-8" / "cluster0" / "node"
    for node in (old, live):
        for sub in ("root/io.containerd.content.v1.content", "state"):
            (node / "containerd" / sub).mkdir(parents=True)
        (node / "containerd" / "root" / "blob").write_bytes(b"x" * 1024)
        (node / "containerd" / "config.toml").write_text("")
        (node / "imported.txt").write_text("runtime.oci\n")
        (node / "pv").mkdir()
    # a process whose command line names the live node's containerd directory, as containerd's does
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--config",
                               f"{live}/containerd/config.toml"])
    try:
        r = subprocess.run(["bash", str(ROOT / "hack" / "reclaim.sh")], env={**os.environ, "TMPDIR": str(tmp_path)},
                           capture_output=True, text=True, check=True)
    finally:
        holder.kill()
        holder.wait()
    assert not (old / "containerd" / "root").exists() and not (old / "containerd" / "state").exists(), r.stderr
    assert not (old / "imported.txt").exists() and (old / "pv").is_dir() and (old / "containerd" / "config.toml").exists()
    assert (live / "containerd" / "root" / "blob").exists() and (live / "imported.txt").exists(), r.stderr
    assert "in use, kept" in r.stderr and "GiB free" in r.stderr
