"""Every pod the operator builds is admitted in a namespace that enforces Pod Security ``restricted``
(what a platform's tenant namespaces commonly enforce): each role's pod template, created as a Pod
with a server-side dry run, passes the real API server's PodSecurity admission. A privileged pod in the
same namespace is refused, so the check is live. The e2e scenario of the code sandbox runs a whole job
in such a namespace on the real node."""
from __future__ import annotations

from typing import Any

import pytest

from rft_operator.builders import BuildContext, desired_children
from rft_operator.kube import KubeError
from tests.operator.cluster_support import api  # noqa: F401
from tests.operator.support import GOLDEN_INPUTS, make_job, manifest

pytestmark = pytest.mark.cluster

JOBS = {
    "tiny": lambda ns: make_job(namespace=ns),
    "vllm-lora": lambda ns: make_job(manifest(GOLDEN_INPUTS / "vllm-lora.yaml"), namespace=ns),
    "bundle": lambda ns: make_job(manifest(GOLDEN_INPUTS / "bundle.yaml"), namespace=ns),
    "code-sandbox": lambda ns: make_job(namespace=ns, evaluator={"builtin": "code_sandbox", "remote": True}),
    "fetch": lambda ns: make_job(namespace=ns, model={"base": "hf://HuggingFaceTB/SmolLM2-135M-Instruct"}),
}


def _restricted(api: Any, namespace: str) -> None:  # noqa: F811
    api.request("PATCH", f"/api/v1/namespaces/{namespace}", body={"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}},
        content_type="application/merge-patch+json")


def _dry_run_pod(api: Any, namespace: str, name: str, template: dict) -> None:  # noqa: F811
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **template.get("metadata", {})},
           "spec": {k: v for k, v in template["spec"].items() if k != "subdomain"}}
    api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod, query={"dryRun": "All"})


@pytest.mark.parametrize("which", sorted(JOBS))
def test_every_pod_of_the_job_is_admitted_under_restricted(api, namespace, which) -> None:  # noqa: F811
    _restricted(api, namespace)
    objs = desired_children(JOBS[which](namespace), BuildContext())
    templates = [(o["metadata"]["name"], o["spec"]["template"]) for o in objs if o["kind"] in ("Deployment", "Job")]
    assert templates, which
    for sa in {t["spec"].get("serviceAccountName") for _, t in templates} - {None}:  # admission looks them up
        api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                    body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})
    for name, template in templates:
        _dry_run_pod(api, namespace, f"{name}-probe"[:63], template)


def test_a_privileged_pod_is_refused_there(api, namespace) -> None:  # noqa: F811
    _restricted(api, namespace)
    template = {"spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}
    with pytest.raises(KubeError) as err:
        _dry_run_pod(api, namespace, "privileged", template)
    assert err.value.status == 403 and "restricted" in str(err.value)
