"""#55 through one reconcile pass against a stub API: a child the API server refuses as too large (the
rendered config over a ConfigMap's 1 MiB) ends the job ValidationFailed (ConfigTooLarge) instead of
retrying for ever, and no workload is created; a token Secret found at a restart is never replaced;
the token's digest (never the token) is on every role's pod template."""
from __future__ import annotations

import copy
from typing import Any, Optional

from rft_operator import names
from rft_operator.kube import KubeError
from rft_operator.reconcile import reconcile
from tests.operator.support import FIXED_UID, at, manifest

Obj = dict[str, Any]


class StubKube:
    """Answers a reconcile's calls from memory; ``refuse``: (kind, name) → the KubeError its apply raises."""

    def __init__(self, refuse: Optional[dict[tuple[str, str], KubeError]] = None):
        self.objects: dict[tuple[str, str], Obj] = {}
        self.refuse = refuse or {}
        self.created: list[tuple[str, str]] = []
        self.patches: list[tuple[str, str, Obj]] = []

    def get(self, kind: str, namespace: Optional[str], name: str) -> Optional[Obj]:
        return copy.deepcopy(self.objects.get((kind, name)))

    def list(self, kind: str, namespace: Optional[str], label_selector: Optional[str] = None) -> list[Obj]:
        return []

    def create(self, obj: Obj) -> Obj:
        key = (obj["kind"], obj["metadata"].get("name") or obj["metadata"].get("generateName", ""))
        self.created.append(key)
        self.objects[key] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    def apply(self, obj: Obj, force: bool = True) -> Obj:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.refuse:
            raise self.refuse[key]
        self.objects[key] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    def delete(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def replace_status(self, kind: str, namespace: Optional[str], name: str, status: Obj) -> Obj:
        self.status = status
        return {"kind": kind, "metadata": {"name": name, "namespace": namespace}, "status": status}

    def patch(self, kind: str, namespace: Optional[str], name: str, patch: Obj, subresource: Optional[str] = None) -> Obj:
        self.patches.append((kind, name, patch))
        return {}


def _job_obj() -> Obj:
    doc = manifest()
    doc["metadata"].update(namespace="default", uid=FIXED_UID, generation=1)
    return doc


def test_a_config_map_refused_as_too_large_fails_the_job_with_its_cause() -> None:
    name = names.config("tiny-arith")
    err = KubeError(422, "Invalid", f'ConfigMap "{name}" is invalid: []: Too long: must have at most 1048576 bytes')
    api = StubKube(refuse={("ConfigMap", name): err})
    out = reconcile(api, _job_obj(), now=at(0), children=[], pods=[])  # type: ignore[arg-type]
    assert out.phase == "ValidationFailed"
    failed = next(c for c in api.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ConfigTooLarge" and name in failed["message"] and "1048576" in failed["message"]
    assert not [k for k in out.applied if k[0] in ("Deployment", "Job")]  # no pod reads a config not there


def test_a_413_is_too_large_too_and_another_refusal_is_not_terminal() -> None:
    name = names.config("tiny-arith")
    api = StubKube(refuse={("ConfigMap", name): KubeError(413, "Request Entity Too Large", "limit is 3145728")})
    assert reconcile(api, _job_obj(), now=at(0), children=[], pods=[]).phase == "ValidationFailed"  # type: ignore[arg-type]
    api = StubKube(refuse={("ConfigMap", name): KubeError(422, "Invalid", "metadata.labels: Invalid value")})
    assert reconcile(api, _job_obj(), now=at(0), children=[], pods=[]).phase != "ValidationFailed"  # type: ignore[arg-type]


def test_the_token_is_minted_once_and_its_digest_is_on_every_role_template() -> None:
    api = StubKube()
    reconcile(api, _job_obj(), now=at(0), children=[], pods=[])  # type: ignore[arg-type]
    secret = api.objects[("Secret", names.token("tiny-arith"))]
    digest = secret["metadata"]["annotations"][names.ANNOTATION_TOKEN_DIGEST]
    token = secret["data"]["token"]
    assert digest and digest not in token
    templates = [o["spec"]["template"] for (k, _), o in api.objects.items() if k in ("Deployment", "Job")]
    assert templates and all(t["metadata"]["annotations"][names.ANNOTATION_TOKEN_DIGEST] == digest for t in templates)
    # a new operator process (no cache) reads the existing Secret: never a second token
    reconcile(api, _job_obj(), now=at(1), children=[], pods=[])  # type: ignore[arg-type]
    assert api.created.count(("Secret", names.token("tiny-arith"))) == 1
    assert api.objects[("Secret", names.token("tiny-arith"))]["data"]["token"] == token


def test_a_token_secret_missing_at_a_restart_is_minted_anew_for_every_role() -> None:
    api = StubKube()
    reconcile(api, _job_obj(), now=at(0), children=[], pods=[])  # type: ignore[arg-type]
    key = ("Secret", names.token("tiny-arith"))
    old = api.objects.pop(key)["metadata"]["annotations"][names.ANNOTATION_TOKEN_DIGEST]  # deleted by hand
    children = [copy.deepcopy(o) for k, o in api.objects.items() if k[0] != "Secret"]
    out = reconcile(api, _job_obj(), now=at(1), children=children, pods=[])  # type: ignore[arg-type]
    new = api.objects[key]["metadata"]["annotations"][names.ANNOTATION_TOKEN_DIGEST]
    assert new != old and out.token_recreated
    assert any(e.reason == "TokenRecreated" for e in out.events)
    deployments = [o for (k, _), o in api.objects.items() if k == "Deployment"]
    assert deployments and all(o["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_TOKEN_DIGEST] == new
                               for o in deployments)  # each rolls with the new token
    assert ("Job", names.trainer("tiny-arith")) in out.deleted  # recreated, same attempt, with the new token


def test_a_job_that_ends_releases_its_existing_claim_and_a_live_holder_holds_the_next() -> None:
    doc = _job_obj()
    doc["spec"]["checkpoint"] = {"existingClaim": "shared"}
    api = StubKube()
    api.objects[("PersistentVolumeClaim", "shared")] = {"metadata": {"name": "shared", "resourceVersion": "3"}}
    reconcile(api, copy.deepcopy(doc), now=at(0), children=[], pods=[])  # type: ignore[arg-type]
    mine = f"tiny-arith/{FIXED_UID}"
    assert ("PersistentVolumeClaim", "shared", {"metadata": {"resourceVersion": "3", "annotations": {
        names.ANNOTATION_USED_BY: mine}}}) in api.patches
    api.objects[("PersistentVolumeClaim", "shared")]["metadata"]["annotations"] = {names.ANNOTATION_USED_BY: mine}
    ended = {**copy.deepcopy(doc), "status": {"phase": "Succeeded"}}
    reconcile(api, ended, now=at(1), children=[], pods=[])  # type: ignore[arg-type]
    assert api.patches[-1][2]["metadata"]["annotations"] == {names.ANNOTATION_USED_BY: None}

    other = copy.deepcopy(doc)
    other["metadata"].update(name="other", uid="u-2")
    api.objects[("RFTJob", "tiny-arith")] = {"metadata": {"name": "tiny-arith", "uid": FIXED_UID},
                                             "status": {"phase": "Running"}}
    out = reconcile(api, other, now=at(2), children=[], pods=[])  # type: ignore[arg-type]
    assert out.phase == "Suspended" and "RFTJob tiny-arith" in api.status["message"]
    assert not [k for k in out.applied if k[0] in ("Deployment", "Job")]
