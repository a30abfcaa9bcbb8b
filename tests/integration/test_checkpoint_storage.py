"""The checkpoint claim against a real API server and its garbage collector: retained when asked,
adopted by a new job of the same name; ReadWriteMany for several trainer nodes."""
from __future__ import annotations

import pytest

from rft_operator import names
from tests.operator.cluster_support import (  # noqa: F401
    api,
    crd,
    create_job,
    job_manifest,
    operator,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster


def test_retained_claim_outlives_its_job_and_is_adopted_by_the_next(cluster, api, operator, namespace) -> None:
    doc = job_manifest("keep", checkpoint={"retainOnDelete": True})
    first = create_job(api, namespace, doc)
    claim = names.checkpoints("keep")
    pvc = wait_for("the claim", lambda: api.get("PersistentVolumeClaim", namespace, claim))
    assert "ownerReferences" not in pvc["metadata"]
    assert pvc["metadata"]["annotations"][names.ANNOTATION_RETAINED_FOR] == first["metadata"]["uid"]
    wait_for("the config", lambda: api.get("ConfigMap", namespace, names.config("keep")))

    api.delete("RFTJob", namespace, "keep")
    # the garbage collector deletes the owned children; the retained claim stays
    wait_for("owned children collected", lambda: api.get("ConfigMap", namespace, names.config("keep")) is None,
             timeout=90)
    kept = api.get("PersistentVolumeClaim", namespace, claim)
    assert kept is not None and kept["metadata"]["uid"] == pvc["metadata"]["uid"]

    second = create_job(api, namespace, doc)
    adopted = wait_for("the claim adopted", lambda: (p := api.get("PersistentVolumeClaim", namespace, claim))
                       and p["metadata"]["annotations"].get(names.ANNOTATION_RETAINED_FOR) == second["metadata"]["uid"]
                       and p)
    assert adopted["metadata"]["uid"] == pvc["metadata"]["uid"]  # the same claim: its checkpoints are resumed
    trainer = wait_for("the trainer Job", lambda: api.get("Job", namespace, names.trainer("keep")))
    vols = trainer["spec"]["template"]["spec"]["volumes"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}} in vols


def test_several_trainer_nodes_get_a_read_write_many_claim(cluster, api, operator, namespace) -> None:
    doc = job_manifest("wide")
    doc["spec"]["trainer"]["nodes"] = 2
    create_job(api, namespace, doc)
    pvc = wait_for("the claim", lambda: api.get("PersistentVolumeClaim", namespace, names.checkpoints("wide")))
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
