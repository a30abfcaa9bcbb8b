"""The chart's Argo CD health check (charts/rft-operator/files/argocd/health.lua) run in real Lua 5.1
(lupa, the language version of Argo CD's gopher-lua), with only the base libraries Argo CD's sandbox
gives a health script, against RFTJobs whose status is built by the API's own status model (as the
operator writes it): one verdict per phase, and a spec change the operator has not reconciled yet."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rft_api.constants import API_VERSION, PHASES
from rft_api.status import Condition, RFTJobStatus

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "charts" / "rft-operator" / "files" / "argocd" / "health.lua"

# Runs in the lupa venv: reads [{...RFTJob...}, ...] on stdin, prints [{"status", "message"}, ...].
RUNNER = r"""
import json, sys
import lupa.lua51 as lua51
script = open(sys.argv[1]).read()
out = []
for obj in json.load(sys.stdin):
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    g = lua.globals()
    for name in ("os", "io", "require", "dofile", "loadfile", "package", "debug"):
        g[name] = None  # what a health script may not reach in Argo CD
    g.obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(script)
    out.append({"status": hs["status"], "message": hs["message"]})
print(json.dumps(out))
"""


@functools.cache
def _lupa_python() -> str:
    out = subprocess.run(["bash", str(ROOT / "hack" / "lupa-venv.sh")], capture_output=True, text=True,
                         check=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def _health(*objs: dict[str, Any]) -> list[dict[str, str]]:
    r = subprocess.run([_lupa_python(), "-c", RUNNER, str(SCRIPT)], input=json.dumps(list(objs)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _job(status: RFTJobStatus | None, generation: int = 3) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "RFTJob",
                           "metadata": {"name": "j", "namespace": "ml", "generation": generation},
                           "spec": {"model": {"base": "builtin:tiny"}}}
    if status is not None:
        obj["status"] = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return obj


def _status(phase: str, **kw: Any) -> RFTJobStatus:
    return RFTJobStatus(phase=phase, observed_generation=3, **kw)


EXPECTED = {
    "Pending": ("Progressing", "Pending: waiting for the inference role"),
    "Provisioning": ("Progressing", "Provisioning: fetching the model"),
    "Running": ("Progressing", "Running, step 12/30: training"),
    "Succeeded": ("Healthy", "Succeeded: trained 30 steps"),
    "Failed": ("Degraded", "Failed (EvaluatorFailing): every sample of a step failed"),
    "Suspended": ("Suspended", "Suspended: spec.suspend is true"),
    "ValidationFailed": ("Degraded", "ValidationFailed: spec.trainer.maxSteps: must be > 0"),
}
MESSAGES = {
    "Pending": "waiting for the inference role", "Provisioning": "fetching the model", "Running": "training",
    "Succeeded": "trained 30 steps", "Failed": "every sample of a step failed", "Suspended": "spec.suspend is true",
    "ValidationFailed": "spec.trainer.maxSteps: must be > 0",
}


def test_every_phase_has_its_verdict() -> None:
    assert set(EXPECTED) == set(PHASES)  # a new phase needs a verdict here and in health.lua
    objs = []
    for phase in PHASES:
        kw: dict[str, Any] = {"message": MESSAGES[phase], "step": 12, "total_steps": 30}
        if phase == "Failed":
            kw["conditions"] = [Condition(type="Failed", status="True", reason="EvaluatorFailing", message="x")]
        objs.append(_job(_status(phase, **kw)))
    got = _health(*objs)
    assert [(h["status"], h["message"]) for h in got] == [EXPECTED[p] for p in PHASES]


@pytest.mark.parametrize("observed", [None, 2])
def test_a_spec_change_not_yet_reconciled_is_progressing(observed: int | None) -> None:
    done = RFTJobStatus(phase="Succeeded", observed_generation=observed, message="trained")
    [h] = _health(_job(done, generation=3))
    assert h == {"status": "Progressing", "message": "waiting for the rft-operator to reconcile generation 3"}


def test_a_new_job_without_status_is_progressing() -> None:
    [h] = _health(_job(None))
    assert h["status"] == "Progressing" and "rft-operator" in h["message"]


def test_running_without_a_step_count_and_without_a_message() -> None:
    [h] = _health(_job(_status("Running")))
    assert h == {"status": "Progressing", "message": "Running"}
