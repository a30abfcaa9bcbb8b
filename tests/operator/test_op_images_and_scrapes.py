"""The images a job's pods run come from the operator's configuration when the job names none (its
--runtime-image and --vllm-image, the chart's images.*), an image reference that does not parse is
refused naming the field, and the job's NetworkPolicies admit the configured Prometheus (--scrape-from,
the chart's metrics.scrapeFrom) to each role's metrics port and nowhere else."""
from __future__ import annotations

import json
from typing import Any

import pytest

from rft_api.job import InvalidSpec
from rft_operator.builders import BuildContext, desired_children
from rft_operator.builders.network import policies
from rft_operator.main import config_from_args, parse_args
from tests.operator.support import GOLDEN_INPUTS, make_job, manifest

RUNTIME = "registry.example.com:5000/platform/rft-runtime:1.2.3"
VLLM = "registry.example.com:5000/platform/vllm-openai@sha256:" + "a" * 64
PROM = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}


def images_by_container(job: Any, ctx: BuildContext) -> dict[str, str]:
    out = {}
    for o in desired_children(job, ctx, fetch_job=True):
        if o["kind"] in ("Deployment", "Job"):
            pod = o["spec"]["template"]["spec"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                out[f'{o["metadata"]["name"]}/{c["name"]}'] = c["image"]
    return out


def test_a_job_naming_no_image_runs_the_operators_configured_images() -> None:
    ctx = BuildContext(runtime_image=RUNTIME, vllm_image=VLLM)
    tiny = images_by_container(make_job(), ctx)
    assert tiny and set(tiny.values()) == {RUNTIME}, tiny
    vllm_job = make_job(manifest(GOLDEN_INPUTS / "vllm-lora.yaml"))
    assert vllm_job.spec.inference.image is None
    images = images_by_container(vllm_job, ctx)
    assert images[f"{vllm_job.name}-inference/inference"] == VLLM
    assert {i for k, i in images.items() if not k.endswith("-inference/inference")} == {RUNTIME}


def test_the_jobs_own_images_win_over_the_operators() -> None:
    ctx = BuildContext(runtime_image=RUNTIME, vllm_image=VLLM)
    job = make_job(manifest(GOLDEN_INPUTS / "vllm-lora.yaml"), runtimeImage="example.org/mine:2")
    job.spec.inference.image = "example.org/vllm:3"
    images = images_by_container(job, ctx)
    assert images.pop(f"{job.name}-inference/inference") == "example.org/vllm:3"
    assert set(images.values()) == {"example.org/mine:2"}


@pytest.mark.parametrize("ref", [
    "rft-runtime", "ghcr.io/rft-dev/rft-runtime:0.1.0", "localhost:5000/a/b_c.d-e:v1.2",
    "10.213.3.1:5000/rft/rft-runtime:0.1.0", "img@sha256:" + "0" * 64, "a.b/c:t@sha256:" + "f" * 64,
])
def test_image_references_that_parse_are_accepted(ref: str) -> None:
    assert make_job(runtimeImage=ref).spec.runtime_image == ref


@pytest.mark.parametrize("ref", [
    "Upper/Case:1", "ghcr.io/rft dev/x", "x:tag:tag", "x@sha256:short", "host:port/x", "-x", "x/", "x::1",
    "https://ghcr.io/x",
])
def test_an_image_reference_that_does_not_parse_is_refused_naming_the_field(ref: str) -> None:
    with pytest.raises(InvalidSpec, match=r"runtimeImage"):
        make_job(runtimeImage=ref)
    doc = manifest(GOLDEN_INPUTS / "vllm-lora.yaml")
    doc["spec"]["inference"]["image"] = ref
    with pytest.raises(InvalidSpec, match=r"inference\.image"):
        make_job(doc)


def test_the_operator_flags_set_the_default_images_and_refuse_a_bad_one(monkeypatch, capsys) -> None:
    monkeypatch.delenv("RFT_RUNTIME_IMAGE", raising=False)
    monkeypatch.delenv("RFT_VLLM_IMAGE", raising=False)
    cfg = config_from_args(parse_args(["--runtime-image", RUNTIME, "--vllm-image", VLLM]))
    assert (cfg.runtime_image, cfg.vllm_image) == (RUNTIME, VLLM)
    default = config_from_args(parse_args([]))
    assert (default.runtime_image, default.vllm_image) == (BuildContext().runtime_image, BuildContext().vllm_image)
    monkeypatch.setenv("RFT_RUNTIME_IMAGE", RUNTIME)
    assert config_from_args(parse_args([])).runtime_image == RUNTIME
    with pytest.raises(SystemExit):
        parse_args(["--vllm-image", "Not/An:image:ref"])
    assert "--vllm-image" in capsys.readouterr().err
    monkeypatch.setenv("RFT_RUNTIME_IMAGE", "bad ref")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "--runtime-image" in capsys.readouterr().err


def test_the_operators_pull_policy_and_secrets_reach_every_container_and_pod() -> None:
    doc = manifest()
    doc["spec"]["trainer"]["pod"] = {"imagePullSecrets": ["own", "shared"]}
    job = make_job(doc)
    plain = desired_children(job, BuildContext(), fetch_job=True)
    ctx = BuildContext(image_pull_policy="Always", image_pull_secrets=("shared", "site"))
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"]
            for o in desired_children(job, ctx, fetch_job=True) if o["kind"] in ("Deployment", "Job")}
    assert len(pods) >= 3
    for name, pod in pods.items():
        assert {c.get("imagePullPolicy") for c in pod.get("initContainers", []) + pod["containers"]} == {"Always"}
        want = ["own", "shared", "site"] if name == f"{job.name}-trainer" else ["shared", "site"]
        assert [s["name"] for s in pod["imagePullSecrets"]] == want, name
    for o in plain:  # none configured: nothing set
        if o["kind"] in ("Deployment", "Job"):
            pod = o["spec"]["template"]["spec"]
            assert all("imagePullPolicy" not in c for c in pod.get("initContainers", []) + pod["containers"])
    cfg = config_from_args(parse_args(["--image-pull-policy", "Always", "--image-pull-secret", "a",
                                       "--image-pull-secret", "b", "--image-pull-secret", "a"]))
    assert (cfg.image_pull_policy, cfg.image_pull_secrets) == ("Always", ("a", "b"))
    for bad in (["--image-pull-policy", "Sometimes"], ["--image-pull-secret", "Not_A_Name"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def by_name(job: Any, ctx: BuildContext) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in policies(job, ctx)}


@pytest.mark.parametrize("case", ["tiny", "bundle", "vllm-lora"])
def test_scrape_peers_reach_every_roles_metrics_port_and_nothing_else(case: str) -> None:
    job = make_job() if case == "tiny" else make_job(manifest(GOLDEN_INPUTS / f"{case}.yaml"))
    plain, scraped = by_name(job, BuildContext()), by_name(job, BuildContext(scrape_from=(PROM,)))
    metrics_ports = {f"{job.name}-inference": job.spec.inference.port, f"{job.name}-trainer": BuildContext().coordinator_port,
                     f"{job.name}-reward": BuildContext().reward_port}
    assert plain.keys() == scraped.keys()
    for name, pol in scraped.items():
        before, after = plain[name]["spec"], pol["spec"]
        if name == f"{job.name}-rollout":  # egress only; the rollout pods serve no metrics
            assert after == before
            continue
        assert all(rule in after["ingress"] for rule in before["ingress"])
        added = [rule for rule in after["ingress"] if rule not in before["ingress"]]
        assert added == [{"from": [PROM], "ports": [{"port": metrics_ports[name], "protocol": "TCP"}]}], name
        assert {k: v for k, v in after.items() if k != "ingress"} == {k: v for k, v in before.items() if k != "ingress"}
    # no peers configured: no rule beyond the job's own roles
    for pol in plain.values():
        for rule in pol["spec"].get("ingress", []):
            assert all("podSelector" in p and "namespaceSelector" not in p for p in rule["from"]), pol


def test_scrape_from_flags_are_parsed_and_bad_ones_refused(capsys) -> None:
    cfg = config_from_args(parse_args(["--scrape-from", json.dumps(PROM),
                                       "--scrape-from", '{"namespaceSelector": {}}']))
    assert cfg.scrape_from == (PROM, {"namespaceSelector": {}})
    for bad in ['{"ipBlock": {"cidr": "0.0.0.0/0"}}', "[]", "{}", "not json",
                '{"podSelector": {"matchLabels": {"a": 1}}}', '{"podSelector": {"labels": {}}}']:
        with pytest.raises(SystemExit):
            parse_args(["--scrape-from", bad])
        assert "--scrape-from" in capsys.readouterr().err


def _chart_operator_config(*sets: str, values: str | None = None) -> Any:
    import subprocess
    from pathlib import Path

    import yaml

    from e2e.cluster import bin_dir

    chart = Path(__file__).resolve().parents[2] / "charts" / "rft-operator"
    args = [str(bin_dir() / "helm"), "template", "rft", str(chart), "-n", "ops"]
    for s in sets:
        args += ["--set", s]
    if values is not None:
        args += ["-f", "-"]
    p = subprocess.run(args, capture_output=True, text=True, input=values)
    if p.returncode != 0:
        return p.stderr
    docs = yaml.safe_load_all(p.stdout)
    (dep,) = [d for d in docs if d and d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return config_from_args(parse_args(container["args"]))


@pytest.fixture
def helm() -> None:
    from e2e.cluster import bin_dir

    if not (bin_dir() / "helm").exists():
        pytest.skip("helm is not built (hack/prepare.sh)")


def test_the_charts_images_and_scrape_peers_reach_the_operator(helm, monkeypatch) -> None:
    """images.runtime, images.vllm and metrics.scrapeFrom become the flags the operator reads back; the
    chart's defaults are the operator's own; a reference that does not parse is refused by the schema."""
    monkeypatch.delenv("RFT_RUNTIME_IMAGE", raising=False)
    monkeypatch.delenv("RFT_VLLM_IMAGE", raising=False)
    default = _chart_operator_config()
    assert (default.runtime_image, default.vllm_image, default.scrape_from) == (
        BuildContext().runtime_image, BuildContext().vllm_image, ())
    cfg = _chart_operator_config(f"images.runtime={RUNTIME}", f"images.vllm={VLLM}",
                                 values=json.dumps({"metrics": {"scrapeFrom": [PROM]}}))
    assert (cfg.runtime_image, cfg.vllm_image, cfg.scrape_from) == (RUNTIME, VLLM, (PROM,))
    cfg = _chart_operator_config("images.pullPolicy=Always", "images.pullSecrets={regcred}")
    assert (cfg.image_pull_policy, cfg.image_pull_secrets) == ("Always", ("regcred",))
    assert (default.image_pull_policy, default.image_pull_secrets) == (None, ())
    for bad in ("images.runtime=Not:A:ref", "images.vllm=https://x/y", "images.pullPolicy=Sometimes"):
        err = _chart_operator_config(bad)
        assert isinstance(err, str) and bad.split("=")[0].split(".")[1] in err, err
    err = _chart_operator_config(values=json.dumps({"metrics": {"scrapeFrom": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}}))
    assert isinstance(err, str) and "scrapeFrom" in err, err
