"""Images from a private registry on the real node: a local OCI registry (distribution's ``registry``,
``e2e/registry.py``) with basic auth, bound to the node's host-side address, with containerd told to
reach it over plain HTTP. The operator is installed with the chart's ``images.runtime`` naming the
registry's copy of the runtime image, ``images.pullPolicy: Always`` and ``images.pullSecrets: [regcred]``,
so a job that names no image pulls every role's image from the registry with the namespace's
``kubernetes.io/dockerconfigjson`` Secret. With a wrong password in that Secret the job fails
``PodCannotStart`` with the kubelet's ``ErrImagePull``/``ImagePullBackOff`` and the registry's refusal;
with the right one every role runs from the registry's image (its pods' ``imageID`` is the registry's
digest). ``hack/build-images.sh`` with ``REGISTRY=`` pushes the operator image there (the product's push).
In front of the same registry, a proxy answering 429 for two minutes (:mod:`tests.support.throttle`)
delays a job's pulls and the job still Succeeds."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster
from e2e.node import LocalNode
from e2e.registry import LocalRegistry
from tests.e2e.stack import EXAMPLES, ROOT, JobDriver, Platform, example_job, install_platform, uninstall_platform
from tests.support.polling import wait_for
from tests.support.throttle import ThrottlingProxy

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

USER, PASSWORD = "rft-puller", "s3cret-pull"
SECRET = "regcred"
RUNTIME_TAG = "rft-runtime:0.1.0"
MANIFEST_TYPES = ",".join((  # what a tag may name: an image manifest or an index of them
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.distribution.manifest.list.v2+json"))


@pytest.fixture(scope="module")
def registry(on_real_node: LocalNode, node_images: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """The registry on the node's host-side address, holding the runtime image (pushed from the node's own
    content with ``ctr images push``: nothing is rebuilt or re-read from disk for it)."""
    t0 = time.monotonic()
    reg = LocalRegistry(tmp_path_factory.mktemp("registry"), host=on_real_node.net.host_ip,
                        users={USER: PASSWORD}).start()
    try:
        on_real_node.trust_registry(reg.address)
        (runtime,) = [ref for ref in node_images if "/rft-runtime:" in ref]
        on_real_node.push_image(runtime, f"{reg.address}/rft/{RUNTIME_TAG}", USER, PASSWORD)
        print(f"\n[e2e] registry up and the runtime image pushed in {time.monotonic() - t0:.1f}s")
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def platform(cluster: LocalCluster, on_real_node: LocalNode, registry: LocalRegistry) -> Iterator[Platform]:
    """The operator from the chart with the registry's runtime image as its default, pulled Always with
    the ``regcred`` Secret of each job's namespace."""
    p = install_platform(cluster, on_real_node, resync_seconds=3, values={
        "images.runtime": f"{registry.address}/rft/{RUNTIME_TAG}", "images.pullPolicy": "Always",
        "images.pullSecrets": "{" + SECRET + "}"})
    try:
        yield p
    finally:
        uninstall_platform(p)


def _pull_secret(registry: LocalRegistry, password: str, address: str = "") -> dict:
    """``regcred`` for the registry (or for ``address``, a proxy in front of it)."""
    config = registry.dockerconfigjson(USER, password)
    if address:
        config = config.replace(f'"{registry.address}"', f'"{address}"')
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
            "type": "kubernetes.io/dockerconfigjson", "stringData": {".dockerconfigjson": config}}


def _condition(status: dict, ctype: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


@pytest.mark.timeout(900)
def test_every_image_of_a_job_is_pulled_from_the_registry_with_its_pull_secret(
        driver: JobDriver, registry: LocalRegistry) -> None:
    image = f"{registry.address}/rft/{RUNTIME_TAG}"
    # a wrong password: the registry refuses the pull, and the job says so
    driver.apply_docs([_pull_secret(registry, "not-the-password")])
    driver.apply_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", "denied", trainer={"maxSteps": 2}))
    st = driver.wait_phase("denied", "Failed", 300)
    failed = _condition(st, "Failed")
    assert failed.get("reason") == "PodCannotStart", failed
    assert any(r in failed["message"] for r in ("ErrImagePull", "ImagePullBackOff")), failed
    assert image in failed["message"] and any(w in failed["message"].lower() for w in ("unauthorized", "denied")), failed
    driver.kubectl("delete", "rftjob", "denied", "--wait=false", check=False)

    # the right one: every role's container runs the registry's image, pulled with the Secret
    driver.apply_docs([_pull_secret(registry, PASSWORD)])
    job = "pulled"
    driver.apply_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", job, trainer={"maxSteps": 2}))
    assert "runtimeImage" not in driver.job(job)["spec"]  # the job names none: the operator's default

    def all_pulled() -> dict | None:
        pods = {role: driver.pods(job, role) for role in ("trainer", "inference", "rollout")}
        if not all(pods.values()):
            return None
        for role_pods in pods.values():
            for p in role_pods:
                ids = [c.get("imageID", "") for c in (p.get("status") or {}).get("containerStatuses") or []]
                if not ids or not all(ids):
                    return None
        return pods
    pods = wait_for("every role's container started from a pulled image", all_pulled, 300,
                    on_timeout=lambda: driver.diagnostics(job))
    for role, role_pods in pods.items():
        for p in role_pods:
            spec = p["spec"]
            assert {"name": SECRET} in spec["imagePullSecrets"], role
            for c in spec.get("initContainers", []) + spec["containers"]:
                assert (c["image"], c["imagePullPolicy"]) == (image, "Always"), (role, c["name"])
    status, headers, _ = registry.request("/v2/rft/rft-runtime/manifests/0.1.0", USER, PASSWORD, "HEAD",
                                          accept=MANIFEST_TYPES)
    assert status == 200
    digest = {k.lower(): v for k, v in headers.items()}["docker-content-digest"]
    # the registry's digest (containerd names it by the first address it pulled it from)
    assert {cs["imageID"].rsplit("@", 1)[1] for ps in pods.values() for p in ps
            for cs in p["status"]["containerStatuses"]} == {digest}
    driver.wait_phase(job, "Running", 300)
    driver.kubectl("delete", "rftjob", job, "--wait=false", check=False)


@pytest.mark.timeout(900)
def test_build_images_pushes_to_a_registry_with_basic_auth(registry: LocalRegistry) -> None:
    """``make images REGISTRY=...``'s push: the operator image (cached, small) to the registry with the
    user's credentials over plain HTTP; the registry then serves its manifest only to that user."""
    env = {**os.environ, "RFT_IMAGES": "operator", "REGISTRY": f"{registry.address}/pushed", "REGISTRY_USER": USER,
           "REGISTRY_PASSWORD": PASSWORD, "REGISTRY_TLS_VERIFY": "false", "REGISTRY_COMPRESSION": "none"}
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(ROOT / "hack" / "build-images.sh")], env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    print(f"\n[e2e] hack/build-images.sh pushed the operator image in {time.monotonic() - t0:.1f}s")
    cache = Path(os.environ.get("RFT_CACHE") or Path.home() / ".cache" / "rft-operator")
    (pushed,) = (cache / "images" / "pushed.txt").read_text().split()
    ref, digest = pushed.split("@")
    repo, tag = ref.removeprefix(f"{registry.address}/").rsplit(":", 1)
    assert repo == "pushed/rft-operator", ref
    accept = MANIFEST_TYPES
    status, headers, _ = registry.request(f"/v2/{repo}/manifests/{tag}", USER, PASSWORD, "HEAD", accept=accept)
    assert status == 200 and {k.lower(): v for k, v in headers.items()}["docker-content-digest"] == digest
    assert registry.status(f"/v2/{repo}/manifests/{tag}", accept=accept) == 401
    assert registry.status(f"/v2/{repo}/manifests/{tag}", USER, "wrong", accept=accept) == 401
    bad = subprocess.run(["bash", str(ROOT / "hack" / "build-images.sh")], env={**env, "REGISTRY_PASSWORD": "wrong"},
                         capture_output=True, text=True, timeout=900)
    assert bad.returncode != 0 and "push" in bad.stderr, bad.stderr[-2000:]


THROTTLE_S = 120.0


@pytest.mark.timeout(1500)
def test_a_registry_answering_429_for_two_minutes_delays_the_job_which_still_succeeds(
        driver: JobDriver, registry: LocalRegistry, on_real_node: LocalNode) -> None:
    """Issue #55: every pull of the job's image goes through a proxy that answers 429 (``Retry-After``) for
    two minutes, then forwards to the registry. Meanwhile the job's pods wait in ``ErrImagePull`` /
    ``ImagePullBackOff`` with the registry's 429, the job's message says it waits on an image pull and it
    does not fail (a transient pull error has ``PULL_ERROR_GRACE_S``); once the registry answers, the
    kubelet's retry pulls the image and the job Succeeds, every pod from the registry's image."""
    with ThrottlingProxy(registry.address, on_real_node.net.host_ip, throttle_s=THROTTLE_S) as proxy:
        on_real_node.trust_registry(proxy.address)
        image = f"{proxy.address}/rft/{RUNTIME_TAG}"
        driver.apply_docs([_pull_secret(registry, PASSWORD, address=proxy.address)])
        job = "throttled"
        driver.apply_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", job, runtimeImage=image,
                                      trainer={"maxSteps": 2}))

        def waits_on_the_pull() -> dict | None:
            st = driver.job(job).get("status") or {}
            return st if "waiting on an image pull" in st.get("message", "") else None

        st = wait_for("the job's message to name the throttled pull", waits_on_the_pull, THROTTLE_S,
                      on_timeout=lambda: driver.diagnostics(job))
        assert "429" in st["message"] and st["phase"] != "Failed", st
        while proxy.throttling:  # the whole window: the job waits, it never fails
            assert driver.job(job)["status"]["phase"] != "Failed", driver.job(job)["status"]
            time.sleep(5)
        assert proxy.throttled >= 2 and proxy.forwarded == 0, (proxy.throttled, proxy.forwarded)

        def started() -> set[str] | None:  # every role's containers started, from a pulled image
            pods = [p for role in ("trainer", "inference", "rollout") for p in driver.pods(job, role)]
            ids = {cs.get("imageID", "") for p in pods for cs in (p.get("status") or {}).get("containerStatuses") or []}
            return ids if len(pods) >= 3 and ids and all(ids) else None

        ids = wait_for("every role's pod started from the image pulled through the proxy", started, 600,
                       on_timeout=lambda: driver.diagnostics(job))
        # The image's digest, whatever name containerd reports it by (an earlier test may have pulled the
        # same image straight from the registry: the imageID then names that address); the pull after the
        # window went through the proxy (it forwarded the kubelet's requests).
        status, headers, _ = registry.request("/v2/rft/rft-runtime/manifests/0.1.0", USER, PASSWORD, "HEAD",
                                              accept=MANIFEST_TYPES)
        assert status == 200
        digest = {k.lower(): v for k, v in headers.items()}["docker-content-digest"]
        assert {i.rsplit("@", 1)[-1] for i in ids} == {digest}, ids
        assert proxy.forwarded >= 1
        st = driver.wait_phase(job, "Succeeded", 900)
        assert st.get("restarts", 0) == 0, st
