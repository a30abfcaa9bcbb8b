"""Cores of a one-machine run (rft_runtime/local/cores.py): the policy, pinning every thread of a
process, and ``rft run`` keeping the trainer to cores of its own while generation overlaps training."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from rft_runtime.local.cores import available_cores, claimed_role_cores, role_cores


def test_the_trainer_gets_its_cores_only_when_generation_overlaps_training_and_a_core_is_left():
    two = {0, 1}
    assert role_cores(two, max_staleness=1, trainer_processes=1, threads=1) == {
        "trainer": (0,), "inference": (1,), "rollout": (1,)}
    assert role_cores(two, max_staleness=2, trainer_processes=1, threads=1)["trainer"] == (0,)
    # a synchronous run takes turns: generation may use every core
    assert role_cores(two, max_staleness=0, trainer_processes=1, threads=1) is None
    # nothing left for the other roles: nothing pinned
    assert role_cores(two, max_staleness=1, trainer_processes=2, threads=1) is None
    assert role_cores(two, max_staleness=1, trainer_processes=1, threads=2) is None
    assert role_cores({3}, max_staleness=1, trainer_processes=1, threads=1) is None
    # every process of the trainer gets `threads` cores, the lowest of those allowed
    plan = role_cores(range(16), max_staleness=1, trainer_processes=2, threads=2)
    assert plan["trainer"] == (0, 1, 2, 3) and plan["inference"] == plan["rollout"] == tuple(range(4, 16))
    assert role_cores([7, 2, 5], max_staleness=1, trainer_processes=1, threads=1) == {
        "trainer": (2,), "inference": (5, 7), "rollout": (5, 7)}


def test_pinning_covers_the_threads_already_running_and_those_started_after():
    """In a process of its own (pinning this one would keep the rest of the suite to one core)."""
    core = min(available_cores())
    code = textwrap.dedent(f"""
        import os, threading
        from rft_runtime.local.cores import pin_process
        stop = threading.Event()
        before = threading.Thread(target=stop.wait); before.start()
        assert pin_process([{core}])
        after = threading.Thread(target=stop.wait); after.start()
        seen = set()
        for tid in os.listdir("/proc/self/task"):
            status = open(f"/proc/self/task/{{tid}}/status").read()
            seen.add(next(l.split()[1] for l in status.splitlines() if l.startswith("Cpus_allowed_list")))
        stop.set(); before.join(); after.join()
        print(len(os.listdir("/proc/self/task")), sorted(seen))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(maxsplit=1)[1].strip() == f"['{core}']"


@pytest.mark.parametrize("pin", [True, False])
def test_rft_run_keeps_the_trainer_to_its_own_cores_while_generation_overlaps_training(tmp_path, tiny_model,
                                                                                      manifest, rft, pin):
    job = manifest("cores", trainer={"maxSteps": 3}, rollout={"maxStaleness": 1})
    out = tmp_path / "out"
    code = rft.run(["run", str(job), "--out", str(out), "--no-progress", *([] if pin else ["--no-pin-cores"])],
                   tmp_path / "run.log")
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert [r["step"] for r in rft.rows(out)] == [1, 2, 3]
    plan = role_cores(available_cores(), max_staleness=1, trainer_processes=1, threads=1) if pin else None
    for role, log in (("trainer", "trainer.log"), ("inference", "inference-0.log"), ("rollout", "rollout-0.log")):
        text = (out / "logs" / log).read_text()
        lines = re.findall(r"running on cores (\S+)", text)
        assert lines == ([",".join(map(str, plan[role]))] if plan else []), (role, text[-2000:])


def test_concurrent_runs_claim_distinct_trainer_cores_and_a_dead_runs_claim_is_dropped(tmp_path):
    """Two runs on one machine (two claims of this process, which lives): the second plans on the cores
    the first's trainer does not hold; a claim ends with its block; the claim of a process that is gone
    (or of a pid that now names another process) is removed and counts for nothing."""
    reg = tmp_path / "cores"
    eight = range(8)
    with claimed_role_cores(eight, max_staleness=1, trainer_processes=1, threads=2, registry=reg) as a:
        assert a == {"trainer": (0, 1), "inference": tuple(range(2, 8)), "rollout": tuple(range(2, 8))}
        with claimed_role_cores(eight, max_staleness=1, trainer_processes=1, threads=2, registry=reg) as b:
            assert b == {"trainer": (2, 3), "inference": (4, 5, 6, 7), "rollout": (4, 5, 6, 7)}
            assert len(list(reg.glob("*.json"))) == 2
            # too few cores left for a third: not pinned, and nothing claimed
            with claimed_role_cores(range(4), max_staleness=1, trainer_processes=1, threads=1, registry=reg) as c:
                assert c is None and len(list(reg.glob("*.json"))) == 2
        assert len(list(reg.glob("*.json"))) == 1  # b's claim went with its block
        # a synchronous run claims nothing and is not pinned
        with claimed_role_cores(eight, max_staleness=0, trainer_processes=1, threads=1, registry=reg) as sync:
            assert sync is None and len(list(reg.glob("*.json"))) == 1
    assert not list(reg.glob("*.json"))

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (reg / "dead.json").write_text(json.dumps({"pid": int(gone.stdout), "start": "1", "cores": [0, 1]}))
    (reg / "reused.json").write_text(json.dumps({"pid": os.getpid(), "start": "0", "cores": [2, 3]}))
    (reg / "garbled.json").write_text("{")
    with claimed_role_cores(eight, max_staleness=1, trainer_processes=1, threads=1, registry=reg) as d:
        assert d["trainer"] == (0,)
        assert [f.name for f in reg.glob("*.json")] == [next(reg.glob(f"{os.getpid()}-*.json")).name]


def test_rft_run_beside_another_runs_trainer_keeps_off_its_cores(tmp_path, tiny_model, manifest, rft, monkeypatch):
    """A live claim of core 0 (this test process's, as another run's would be): `rft run` at
    maxStaleness 1 plans on the other cores (pinned only where two are left), and its claim is gone
    when it ends."""
    reg = tmp_path / "cores"
    monkeypatch.setenv("RFT_CORE_REGISTRY", str(reg))
    job = manifest("cores-beside", trainer={"maxSteps": 2}, rollout={"maxStaleness": 1})
    out = tmp_path / "out"
    with claimed_role_cores(available_cores(), max_staleness=1, trainer_processes=1, threads=1, registry=reg) as held:
        assert held, "this machine has a single core"
        code = rft.run(["run", str(job), "--out", str(out), "--no-progress"], tmp_path / "run.log")
        assert [f.name.split("-")[0] for f in reg.glob("*.json")] == [str(os.getpid())]
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    rest = available_cores() - set(held["trainer"])
    expect = role_cores(rest, max_staleness=1, trainer_processes=1, threads=1)
    text = (out / "logs" / "trainer.log").read_text()
    lines = re.findall(r"running on cores (\S+)", text)
    assert lines == ([",".join(map(str, expect["trainer"]))] if expect else []), text[-2000:]
    if expect is None:
        assert "hold the trainers of other runs" in (tmp_path / "run.log").read_text()
