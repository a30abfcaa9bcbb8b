"""Targeted properties of the child builders (beyond the golden files)."""
from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from rft_api.job import InvalidSpec
from rft_api.layout import CHECKPOINT_DIR, EVALUATOR_DIR
from rft_api.presets import ResolvedAlgorithm, resolve_algorithm
from rft_api.spec import RFTJobSpec
from rft_operator import names
from rft_operator.builders import BuildContext, desired_children, stateful_children
from rft_operator.topology import reward_required
from tests.operator.support import FIXED_UID, GOLDEN_INPUTS, make_job, manifest

ALL_JOBS = {
    "tiny": lambda: make_job(),
    "vllm-lora": lambda: make_job(manifest(GOLDEN_INPUTS / "vllm-lora.yaml")),
    "bundle": lambda: make_job(manifest(GOLDEN_INPUTS / "bundle.yaml")),
    "judge": lambda: make_job(evaluator={"builtin": "llm_judge", "config": {"endpoint": "http://j"},
                                         "apiKeySecretRef": {"name": "judge", "key": "k"}}),
}


def children(job) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in desired_children(job, BuildContext())}


def pod_templates(objs) -> Iterator[tuple[dict, dict]]:
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            yield o, o["spec"]["template"]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield f"{path}.{k}", v
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")


@pytest.mark.parametrize("which", sorted(ALL_JOBS))
def test_every_child_is_owned_labelled_and_namespaced(which: str) -> None:
    job = ALL_JOBS[which]()
    for (kind, name), o in children(job).items():
        meta = o["metadata"]
        assert meta["namespace"] == job.namespace
        assert name.startswith(job.name + "-")
        assert meta["ownerReferences"] == [{
            "apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "name": job.name, "uid": FIXED_UID,
            "controller": True, "blockOwnerDeletion": True}], f"{kind}/{name}"
        labels = meta["labels"]
        assert labels[names.LABEL_NAME] == "rft" and labels[names.LABEL_INSTANCE] == job.name
        assert labels[names.LABEL_MANAGED_BY] == "rft-operator" and labels[names.LABEL_ROLE]
        assert "status" not in o


@pytest.mark.parametrize("which", sorted(ALL_JOBS))
def test_pods_are_locked_down(which: str) -> None:
    job = ALL_JOBS[which]()
    for o, tmpl in pod_templates(children(job).values()):
        pod = tmpl["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["enableServiceLinks"] is False
        role = o["metadata"]["labels"][names.LABEL_ROLE]
        if role == "trainer":
            assert pod["automountServiceAccountToken"] is True
            assert pod["serviceAccountName"] == names.trainer(job.name)
        elif job.spec.service_account_name and role in ("rollout", "reward"):
            assert pod["serviceAccountName"] == job.spec.service_account_name
            assert "automountServiceAccountToken" not in pod
        else:
            assert pod["automountServiceAccountToken"] is False
            assert "serviceAccountName" not in pod
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True
            if c["image"] == BuildContext().runtime_image_of(job):
                assert sc["readOnlyRootFilesystem"] is True
                assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        labels = dict(tmpl["metadata"]["labels"])
        # pods sharing a ReadWriteOnce checkpoint claim carry the label their co-location affinity selects
        assert labels.pop(names.LABEL_SHARES_CHECKPOINTS, job.name) == job.name
        assert labels == names.labels(job.name, o["metadata"]["labels"][names.LABEL_ROLE])


def test_trainer_rbac_allows_only_get_and_patch_of_the_progress_configmap(tiny_job) -> None:
    c = children(tiny_job)
    n = names.trainer(tiny_job.name)
    assert c[("Role", n)]["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                                        "resourceNames": ["tiny-arith-progress"], "verbs": ["get", "patch"]}]
    rb = c[("RoleBinding", n)]
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": n}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": n, "namespace": "default"}]
    assert c[("ServiceAccount", n)]["automountServiceAccountToken"] is False
    assert [k for k in c if k[0] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")] == [
        ("Role", n), ("RoleBinding", n)]


@pytest.mark.parametrize("which", sorted(ALL_JOBS))
def test_secrets_only_as_secret_key_refs_in_env(which: str) -> None:
    job = ALL_JOBS[which]()
    objs = list(children(job).values())
    for o in objs:
        assert o["kind"] != "Secret"
        for path, value in walk(o):
            if path.endswith(".secretKeyRef"):
                assert path.endswith(".valueFrom.secretKeyRef") and ".env[" in path, path
            if path.endswith(".volumes") and value:
                assert all("secret" not in v for v in value), path
    for _, tmpl in pod_templates(objs):
        for c in tmpl["spec"]["containers"]:
            for e in c.get("env", []):
                if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]:
                    assert "value" not in e


def test_llm_judge_key_goes_to_reward_pods_only() -> None:
    job = ALL_JOBS["judge"]()
    c = children(job)
    expected = {"name": "RFT_EVALUATOR_0_API_KEY", "valueFrom": {"secretKeyRef": {"name": "judge", "key": "k"}}}
    reward_env = c[("Deployment", names.reward(job.name))]["spec"]["template"]["spec"]["containers"][0]["env"]
    rollout_env = c[("Deployment", names.rollout(job.name))]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert expected in reward_env
    # the only Secret rollout pods see is their own job's data-plane token
    refs = [e["valueFrom"]["secretKeyRef"] for e in rollout_env if "secretKeyRef" in e.get("valueFrom", {})]
    assert refs == [{"name": names.token(job.name), "key": "token"}]
    config = json.loads(c[("ConfigMap", names.config(job.name))]["data"]["config.json"])
    assert config["secretEnv"] == [{"index": 0, "env": "RFT_EVALUATOR_0_API_KEY"}]
    assert config["scoring"] == "reward"


@pytest.mark.parametrize("evaluator,expected", [
    ({"builtin": "math"}, False),
    ({"builtin": "math", "remote": True}, True),
    ({"builtin": "code_sandbox"}, True),
    ({"builtin": "llm_judge", "config": {"endpoint": "http://j"}}, True),
    ({"bundle": {"image": "b:1", "entrypoint": "m:f"}}, False),
    ({"evaluators": [{"builtin": "math"}, {"builtin": "code_sandbox"}]}, True),
])
def test_reward_role_exists_exactly_when_required(evaluator: dict, expected: bool) -> None:
    job = make_job(evaluator=evaluator)
    assert reward_required(job.spec) is expected
    c = children(job)
    assert (("Deployment", names.reward(job.name)) in c) is expected
    assert (("Service", names.reward(job.name)) in c) is expected
    config = json.loads(c[("ConfigMap", names.config(job.name))]["data"]["config.json"])
    assert (config["endpoints"].get("reward") is not None) is expected
    assert config["scoring"] == ("reward" if expected else "rollout")


def test_rollout_runs_the_bundle_image_and_mounts_file_evaluators() -> None:
    job = ALL_JOBS["bundle"]()
    c = children(job)
    pod = c[("Deployment", names.rollout(job.name))]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/calc-bundle:1.2"
    assert pod["containers"][0]["command"] == ["rft", "rollout", "--config", "/etc/rft/config.json",
                                                 "--when-done", "wait"]
    assert {"name": "evaluator", "mountPath": EVALUATOR_DIR, "readOnly": True} in pod["containers"][0]["volumeMounts"]
    vol = next(v for v in pod["volumes"] if v["name"] == "evaluator")
    assert vol["projected"]["sources"] == [
        {"configMap": {"name": "extra-evals", "items": [{"key": "brevity.py", "path": "1/brevity.py"}]}}]
    config = json.loads(c[("ConfigMap", names.config(job.name))]["data"]["config.json"])
    assert config["paths"]["evaluatorFiles"] == [
        {"index": 1, "path": f"{EVALUATOR_DIR}/1/brevity.py", "function": "score"}]
    assert c[("Deployment", names.rollout(job.name))]["spec"]["replicas"] == 3


def test_rollout_uses_the_runtime_image_without_a_bundle(tiny_job) -> None:
    pod = children(tiny_job)[("Deployment", "tiny-arith-rollout")]["spec"]["template"]["spec"]
    assert tiny_job.spec.runtime_image is None  # the job names none: the operator's configured one
    assert pod["containers"][0]["image"] == BuildContext().runtime_image


def test_existing_claim_replaces_the_pvc() -> None:
    job = ALL_JOBS["bundle"]()
    c = children(job)
    assert not any(k[0] == "PersistentVolumeClaim" for k in c)
    trainer = c[("Job", names.trainer(job.name))]["spec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared-ckpt"}} in trainer["volumes"]


def test_checkpoint_claim_sharing_follows_the_access_mode() -> None:
    # one trainer + one inference replica on a ReadWriteOnce claim (Auto): scheduled onto one node together
    job = ALL_JOBS["tiny"]()
    c = children(job)
    assert c[("PersistentVolumeClaim", names.checkpoints(job.name))]["spec"]["accessModes"] == ["ReadWriteOnce"]
    for key in (("Job", names.trainer(job.name)), ("Deployment", names.inference(job.name))):
        tmpl = c[key]["spec"]["template"]
        [term] = tmpl["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items()
    assert "affinity" not in c[("Deployment", names.rollout(job.name))]["spec"]["template"]["spec"]
    # several trainer nodes (Auto): ReadWriteMany, no co-location
    job = make_job(trainer={**manifest()["spec"]["trainer"], "nodes": 2})
    c = children(job)
    assert c[("PersistentVolumeClaim", names.checkpoints(job.name))]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "affinity" not in c[("Job", names.trainer(job.name))]["spec"]["template"]["spec"]


def test_retained_claim_has_no_owner_and_names_its_job() -> None:
    job = make_job(checkpoint={"retainOnDelete": True})
    pvc = children(job)[("PersistentVolumeClaim", names.checkpoints(job.name))]
    assert "ownerReferences" not in pvc["metadata"]
    assert pvc["metadata"]["annotations"][names.ANNOTATION_RETAINED_FOR] == job.metadata["uid"]


def test_pvc_from_spec() -> None:
    job = ALL_JOBS["vllm-lora"]()
    pvc = children(job)[("PersistentVolumeClaim", names.checkpoints(job.name))]
    assert pvc["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}},
                           "storageClassName": "fast"}


def test_trainer_job(tiny_job) -> None:
    job2 = make_job(trainer={"algorithm": "grpo", "learningRate": 1e-4, "maxSteps": 30, "nodes": 3})
    tj = {o["kind"]: o for o in desired_children(job2, BuildContext(trainer_attempt=2))}["Job"]
    assert tj["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "2"
    spec = tj["spec"]
    assert spec["podFailurePolicy"]["rules"] == [
        # a disrupted pod (evicted, preempted) is recreated without counting; the first matching rule applies
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2]}}]
    assert spec["backoffLimit"] == 0 and spec["parallelism"] == 3 and spec["completions"] == 3
    assert spec["completionMode"] == "Indexed"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == "tiny-arith-trainer"
    c = pod["containers"][0]
    assert c["command"] == ["rft", "trainer", "--config", "/etc/rft/config.json"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["RFT_BIND_HOST"]["value"] == "$(POD_IP)"
    assert env["RFT_TRAINER_ATTEMPT"]["value"] == "2"
    # every variable a role gets is read by it (or by its libraries); the rest is in the runtime config
    assert set(env) == {"POD_IP", "RFT_BIND_HOST", "RFT_JOB_TOKEN", "RFT_TRAINER_ATTEMPT", "HOME", "XDG_CACHE_HOME",
                        "HF_HOME", "HF_HUB_OFFLINE", "RFT_METRIC_JOB", "RFT_METRIC_NAMESPACE", "RFT_METRIC_ROLE"}
    assert env["RFT_METRIC_ROLE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['rft.dev/role']"
    assert {"name": "checkpoints", "mountPath": CHECKPOINT_DIR} in c["volumeMounts"]


def test_coordinator_service_is_headless_and_selects_rank_zero(tiny_job) -> None:
    svc = children(tiny_job)[("Service", "tiny-arith-trainer")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {names.LABEL_INSTANCE: "tiny-arith", names.LABEL_ROLE: "trainer",
                                       names.LABEL_COMPLETION_INDEX: "0"}
    assert svc["spec"]["ports"][0]["port"] == 8100
    # pod 0 is also the torch.distributed rendezvous of every trainer process, ready or not
    assert svc["spec"]["ports"][1] == {"name": "rendezvous", "port": 29500, "targetPort": 29500, "protocol": "TCP"}
    assert svc["spec"]["publishNotReadyAddresses"] is True


def test_trainer_process_group_in_the_runtime_contract() -> None:
    job = make_job(trainer={"algorithm": "grpo", "learningRate": 1e-4, "maxSteps": 30, "nodes": 2,
                            "resources": {"limits": {"nvidia.com/gpu": 4}}})
    c = children(job)
    cfg = json.loads(c[("ConfigMap", names.config(job.name))]["data"][names.CONFIG_KEY])
    assert cfg["trainer"]["masterAddress"] == f"{names.trainer(job.name)}.{job.namespace}.svc"
    assert cfg["ports"]["rendezvous"] == 29500
    assert cfg["spec"]["trainer"]["nodes"] == 2 and cfg["spec"]["trainer"].get("processesPerNode") is None
    assert job.spec.trainer.world_size() == 8  # 2 pods x their 4 GPUs
    tj = c[("Job", names.trainer(job.name))]
    ctr = tj["spec"]["template"]["spec"]["containers"][0]
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert {"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"} in ctr["ports"]
    # 4 processes per pod: NCCL's shared memory is a memory-backed /dev/shm (a one-process pod has none)
    assert {"name": "dshm", "mountPath": "/dev/shm"} in ctr["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in tj["spec"]["template"]["spec"]["volumes"]
    one = children(make_job(trainer={"algorithm": "grpo", "learningRate": 1e-4, "maxSteps": 30}))
    pod = one[("Job", names.trainer(job.name))]["spec"]["template"]["spec"]
    assert all(v["name"] != "dshm" for v in pod["volumes"])


def test_builtin_inference(tiny_job) -> None:
    c = children(tiny_job)
    dep = c[("Deployment", "tiny-arith-inference")]
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and dep["spec"]["replicas"] == 1
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    assert ctr["command"] == ["rft", "serve", "--model", "builtin:tiny", "--host", "$(POD_IP)", "--port", "8000",
                              "--served-model-name", "tiny-arith", "--dtype", "auto",
                              "--weights-dir", f"{CHECKPOINT_DIR}/weights"]
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert {"name": "checkpoints", "mountPath": CHECKPOINT_DIR, "readOnly": True} in ctr["volumeMounts"]
    svc = c[("Service", "tiny-arith-inference")]
    assert svc["spec"]["ports"][0]["port"] == 8000 and svc["spec"]["type"] == "ClusterIP"
    # without weight sync, a replica that starts has nothing to load
    off = children(make_job(inference={"weightSync": "none"}))[("Deployment", "tiny-arith-inference")]
    assert "--weights-dir" not in off["spec"]["template"]["spec"]["containers"][0]["command"]


def test_every_ready_inference_replica_is_found_through_a_headless_service(tiny_job) -> None:
    """The trainer publishes to each address of ``<job>-inference-pods`` (ready pods only)."""
    c = children(make_job(inference={"replicas": 3}))
    pods = c[("Service", names.inference_pods("tiny-arith"))]["spec"]
    svc = c[("Service", names.inference("tiny-arith"))]["spec"]
    assert pods["clusterIP"] == "None" and pods["publishNotReadyAddresses"] is False
    assert pods["selector"] == svc["selector"] and pods["ports"] == svc["ports"]
    cfg = json.loads(c[("ConfigMap", "tiny-arith-config")]["data"]["config.json"])
    assert cfg["endpoints"]["inferenceReplicas"] == "http://tiny-arith-inference-pods.default.svc:8000"
    assert cfg["endpoints"]["inference"] == ["http://tiny-arith-inference.default.svc:8000"]


def test_vllm_gets_an_exported_builtin_model() -> None:
    for engine, marker in (("vllm", "--logprobs-mode"),):
        job = make_job(inference={"engine": engine, "weightSync": "none"})
        pod = children(job)[("Deployment", "tiny-arith-inference")]["spec"]["template"]["spec"]
        cmd = pod["containers"][0]["command"]
        assert marker in cmd
        assert "/var/cache/rft/models/tiny" in cmd
        init = pod["initContainers"][0]
        assert init["command"] == ["rft", "model", "export", "--model", "builtin:tiny", "--out",
                                   "/var/cache/rft/models/tiny"]
    vllm = make_job(inference={"engine": "vllm", "weightSync": "none"})
    cmd = children(vllm)[("Deployment", "tiny-arith-inference")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert "--enable-lora" not in cmd  # a frozen policy: no adapters


def test_vllm_lora_flags_fit_the_adapters_kept_and_a_rank_vllm_accepts() -> None:
    for rank, staleness, want_rank, want_loras in ((4, 0, "8", "2"), (16, 0, "16", "2"), (33, 3, "64", "4")):
        job = make_job(model={"base": "builtin:tiny-vllm", "lora": {"rank": rank}},
                       inference={"engine": "vllm", "weightSync": "lora"}, rollout={"maxStaleness": staleness})
        pod = children(job)[("Deployment", "tiny-arith-inference")]["spec"]["template"]["spec"]
        cmd = pod["containers"][0]["command"]
        assert cmd[cmd.index("--max-lora-rank") + 1] == want_rank
        assert cmd[cmd.index("--max-loras") + 1] == cmd[cmd.index("--max-cpu-loras") + 1] == want_loras
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and "VLLM_SERVER_DEV_MODE" not in env


def test_runtime_config(tiny_job) -> None:
    cm = children(tiny_job)[("ConfigMap", "tiny-arith-config")]
    config = json.loads(cm["data"]["config.json"])
    assert config["job"] == {"name": "tiny-arith", "namespace": "default"}
    assert config["endpoints"]["coordinator"] == "http://tiny-arith-trainer.default.svc:8100"
    assert config["endpoints"]["inference"] == ["http://tiny-arith-inference.default.svc:8000"]
    assert config["paths"]["checkpoints"] == "/checkpoints"
    assert ResolvedAlgorithm.model_validate(config["algorithm"]) == resolve_algorithm(tiny_job.spec)
    assert RFTJobSpec.model_validate(config["spec"]) == tiny_job.spec
    assert config["progress"] == {"sink": "configmap", "configMap": "tiny-arith-progress"}


def test_progress_configmap_carries_no_data(tiny_job) -> None:
    cm = children(tiny_job)[("ConfigMap", "tiny-arith-progress")]
    assert set(cm) == {"apiVersion", "kind", "metadata"}


def test_suspended_job_keeps_state_children(tiny_job) -> None:
    kept = {(o["kind"], o["metadata"]["name"]) for o in desired_children(
        tiny_job, BuildContext(), deployments=False, trainer_job=False)}
    assert kept == {(o["kind"], o["metadata"]["name"]) for o in stateful_children(tiny_job, BuildContext())}
    assert ("PersistentVolumeClaim", "tiny-arith-checkpoints") in kept
    assert not any(k[0] in ("Deployment", "Job") for k in kept)


def test_builtin_server_gets_the_spec_dtype_and_context_length() -> None:
    pod = children(make_job(model={"base": "builtin:tiny", "dtype": "float32"}, inference={"maxModelLen": 256}))
    cmd = pod[("Deployment", "tiny-arith-inference")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--max-model-len") + 1] == "256"
    default = children(make_job())[("Deployment", "tiny-arith-inference")]["spec"]["template"]["spec"]
    assert "--max-model-len" not in default["containers"][0]["command"]  # the model's own maximum


def test_sglang_is_not_an_engine() -> None:
    with pytest.raises(InvalidSpec, match="spec.inference.engine"):
        make_job(inference={"engine": "sglang"})


def test_rollout_pods_get_a_file_rollout_function_even_when_the_reward_role_scores() -> None:
    job = make_job(evaluator={"evaluators": [
        {"builtin": "code_sandbox"},
        {"file": {"configMapKeyRef": {"name": "env", "key": "env.py"}, "function": "score", "rollout": "play"}},
        {"file": {"configMapKeyRef": {"name": "env", "key": "judge.py"}}}]})
    assert reward_required(job.spec)
    pod = children(job)[("Deployment", names.rollout(job.name))]["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "evaluator")
    assert vol["projected"]["sources"] == [{"configMap": {"name": "env", "items": [{"key": "env.py", "path": "1/env.py"}]}}]
    config = json.loads(children(job)[("ConfigMap", names.config(job.name))]["data"]["config.json"])
    from rft_api.runtime import parse

    assert parse(config).rollout_function() == f"{EVALUATOR_DIR}/1/env.py:play"


def test_config_edit_changes_every_pod_template_and_only_changed_children() -> None:
    """The rendered config's hash is on every pod template: an edit rolls the pods that read it; the
    applied hash changes exactly for the children whose content changed."""
    before = children(make_job())
    after = children(make_job(trainer={"algorithm": "grpo", "learningRate": 1e-4, "maxSteps": 31}))
    workloads = [k for k in before if k[0] in ("Deployment", "Job")]
    assert len(workloads) >= 3
    for k in workloads:
        old = before[k]["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
        new = after[k]["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
        assert old != new, k
    changed = {k for k in before if before[k]["metadata"]["annotations"][names.ANNOTATION_APPLIED_HASH]
               != after[k]["metadata"]["annotations"][names.ANNOTATION_APPLIED_HASH]}
    assert changed == {("ConfigMap", "tiny-arith-config"), *workloads}
    job_key = ("Job", "tiny-arith-trainer")
    assert (before[job_key]["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
            != after[job_key]["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH])
    assert children(make_job()) == before  # deterministic


def test_rollout_pods_mount_a_model_on_a_volume() -> None:
    """The rollout pods read the tokenizer from the model directory: a model on a claim is mounted
    there (read-only) like in inference and trainer pods (the real node showed it missing)."""
    from rft_operator.builders import rollout
    from tests.operator.support import make_job

    job = make_job(model={"base": "tiny", "volume": {"claimName": "models", "mountPath": "/models"}})
    pod = rollout.deployment_for(job, BuildContext())["spec"]["template"]["spec"]
    assert {"name": "model-0", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    assert {"name": "model-0", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]


@pytest.mark.parametrize("which", sorted(ALL_JOBS))
def test_every_container_has_cpu_and_memory_requests(which: str) -> None:
    """A namespace with a ResourceQuota on requests admits only pods whose every container has them
    (a request taken from a limit counts: Kubernetes defaults it)."""
    job = ALL_JOBS[which]()
    seen = 0
    for _, template in pod_templates(desired_children(job, BuildContext())):
        spec = template["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            res = c["resources"]
            for k in ("cpu", "memory"):
                assert k in res.get("requests", {}) or k in res.get("limits", {}), (which, c["name"], k)
            seen += 1
    assert seen >= 3


def test_default_resources_fill_only_what_a_container_leaves_open() -> None:
    job = make_job(trainer={"resources": {"limits": {"memory": "8Gi"}, "requests": {"nvidia.com/gpu": 1}}},
                   defaultResources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "4"}})
    c = children(job)
    trainer = c[("Job", names.trainer(job.name))]["spec"]["template"]["spec"]["containers"][0]["resources"]
    # memory's request comes from its limit (not the default), the GPU request stays, cpu is defaulted
    assert trainer == {"limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "1", "nvidia.com/gpu": 1}}
    rollout = c[("Deployment", names.rollout(job.name))]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert rollout == {"limits": {"cpu": "4"}, "requests": {"cpu": "1", "memory": "1Gi"}}


def test_each_domain_source_is_mounted_where_the_config_says() -> None:
    """``dataset.mix[].train``: a domain's own ConfigMap is mounted at ``<datasets>/mix-<i>``, its claim
    once, and the runtime config names the file by domain."""
    job = make_job(dataset={"mix": [
        {"domain": "arith", "weight": 2, "train": {"builtin": "arithmetic", "size": 8}},
        {"domain": "words", "weight": 1, "train": {"configMapKeyRef": {"name": "tasks", "key": "words.jsonl"}}},
        {"domain": "code", "weight": 1, "train": {"path": "code.jsonl",
                                                  "volume": {"claimName": "data", "mountPath": "/data"}}}]})
    pod = children(job)[("Job", names.trainer(job.name))]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dataset-mix-1"]["configMap"] == {"name": "tasks", "items": [{"key": "words.jsonl", "path": "words.jsonl"}]}
    assert "dataset-mix-0" not in vols and "dataset-train" not in vols  # builtin: nothing to mount
    claims = [v["persistentVolumeClaim"]["claimName"] for v in vols.values() if "persistentVolumeClaim" in v]
    assert claims == [names.checkpoints(job.name), "data"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    from rft_api.layout import DATASET_DIR
    from rft_api.runtime import parse

    assert mounts["dataset-mix-1"] == f"{DATASET_DIR}/mix-1"
    config = parse(json.loads(children(job)[("ConfigMap", names.config(job.name))]["data"]["config.json"]))
    assert config.paths.datasets.train is None
    assert config.paths.datasets.mix == {"words": f"{DATASET_DIR}/mix-1/words.jsonl", "code": "/data/code.jsonl"}


@pytest.mark.parametrize("which", sorted(ALL_JOBS))
def test_every_variable_the_operator_sets_is_one_a_spec_may_not_replace(which: str) -> None:
    """The API refuses a spec env naming one of RESERVED_ENV_NAMES (the job token, the engine's key, ...):
    that list must hold every variable the builders set, or a spec's env could replace it."""
    from rft_api.constants import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIX

    job = ALL_JOBS[which]()
    users = {e.name for e in job.spec.trainer.env + job.spec.inference.env}
    for _, template in pod_templates(children(job).values()):
        spec = template["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            set_here = {e["name"] for e in c.get("env", []) if not e["name"].startswith(RESERVED_ENV_PREFIX)} - users
            assert set_here <= set(RESERVED_ENV_NAMES), f"{c['name']}: {sorted(set_here - set(RESERVED_ENV_NAMES))}"


# ------------------------------------------------------------------------------------ pod overrides
def _overrides(tag: str, *, worker: bool = False) -> dict:
    """Every pod override of a role, its values naming ``tag`` (the role) so a test sees where each went."""
    out: dict[str, Any] = {
        "nodeSelector": {"pool": tag},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": [tag]}]}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"rft.dev/role": tag}}}],
        "priorityClassName": f"{tag}-priority", "runtimeClassName": f"{tag}-runtime",
        "imagePullSecrets": [f"{tag}-registry"], "labels": {"team": tag}, "annotations": {"example.com/owner": tag},
        "shmSizeLimit": "2Gi", "terminationGracePeriodSeconds": 90,
    }
    if worker:
        out["resources"] = {"requests": {"cpu": "3", "memory": "3Gi"}, "limits": {"memory": "5Gi"}}
        out["env"] = [{"name": "EXTRA", "value": tag}]
    return out


def _overridden_job(**extra_reward: Any):
    doc = manifest(evaluator={"builtin": "math", "remote": True})
    doc["spec"]["trainer"]["pod"] = _overrides("trainer")
    doc["spec"]["inference"]["pod"] = _overrides("inference")
    doc["spec"]["rollout"]["pod"] = _overrides("rollout", worker=True)
    doc["spec"]["reward"] = {"replicas": 3, "pod": _overrides("reward", worker=True), **extra_reward}
    return make_job(doc)


def _workloads(job) -> dict[str, dict]:
    return {o["metadata"]["labels"][names.LABEL_ROLE]: o for o in desired_children(job, BuildContext(), fetch_job=True)
            if o["kind"] in ("Deployment", "Job")}


ROLES_WITH_OVERRIDES = ("inference", "reward", "rollout", "trainer")


@pytest.mark.parametrize("role", ROLES_WITH_OVERRIDES)
def test_every_role_gets_its_pod_overrides(role: str) -> None:
    workload = _workloads(_overridden_job())[role]
    template = workload["spec"]["template"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    assert pod["nodeSelector"] == {"pool": role}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1
    assert pod["topologySpreadConstraints"][0]["labelSelector"] == {"matchLabels": {"rft.dev/role": role}}
    assert pod["priorityClassName"] == f"{role}-priority" and pod["runtimeClassName"] == f"{role}-runtime"
    assert pod["imagePullSecrets"] == [{"name": f"{role}-registry"}]
    assert pod["terminationGracePeriodSeconds"] == 90
    assert template["metadata"]["labels"]["team"] == role
    assert template["metadata"]["annotations"]["example.com/owner"] == role
    shm = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert len(shm) == 1
    (volume,) = [v for v in pod["volumes"] if v["name"] == shm[0]]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    if role in ("rollout", "reward"):
        assert container["resources"] == {"limits": {"memory": "5Gi"}, "requests": {"cpu": "3", "memory": "3Gi"}}
        assert container["env"][-1] == {"name": "EXTRA", "value": role}


def test_reward_replicas_and_the_fetch_job_placed_as_the_trainer() -> None:
    doc = manifest(evaluator={"builtin": "math", "remote": True}, model={"base": "hf://org/model"})
    doc["spec"]["trainer"]["pod"] = _overrides("trainer")
    doc["spec"]["reward"] = {"replicas": 3}
    loads = _workloads(make_job(doc))
    assert loads["reward"]["spec"]["replicas"] == 3
    fetch = loads["fetch"]["spec"]["template"]["spec"]
    assert fetch["nodeSelector"] == {"pool": "trainer"} and fetch["priorityClassName"] == "trainer-priority"
    assert fetch["tolerations"] == loads["trainer"]["spec"]["template"]["spec"]["tolerations"]
    # its shared memory is the trainer's alone
    assert not any(m["mountPath"] == "/dev/shm" for m in fetch["containers"][0]["volumeMounts"])


@pytest.mark.parametrize("role", ROLES_WITH_OVERRIDES)
def test_pod_overrides_leave_what_the_operator_owns(role: str) -> None:
    """The command, the security contexts, the ServiceAccount, the operator's volumes, env, labels and
    affinity term are the same with every override set: overrides only add."""
    plain = _workloads(make_job(manifest(evaluator={"builtin": "math", "remote": True})))[role]["spec"]["template"]
    over = _workloads(_overridden_job())[role]["spec"]["template"]
    p, o = plain["spec"], over["spec"]
    for key in ("securityContext", "serviceAccountName", "automountServiceAccountToken", "restartPolicy", "subdomain"):
        assert o.get(key) == p.get(key), key
    (pc,), (oc,) = p["containers"], o["containers"]
    for key in ("command", "image", "securityContext", "ports", "readinessProbe"):
        assert oc.get(key) == pc.get(key), key
    assert oc["env"][:len(pc["env"])] == pc["env"]
    assert oc["volumeMounts"][:len(pc["volumeMounts"])] == pc["volumeMounts"]
    by_name = {v["name"]: v for v in o["volumes"]}
    for v in p["volumes"]:
        assert by_name[v["name"]] == v or v.get("emptyDir", {}).get("medium") == "Memory", v["name"]
    assert plain["metadata"]["labels"].items() <= over["metadata"]["labels"].items()
    for term in (p.get("affinity") or {}).get("podAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", []):
        assert term in o["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


def test_the_co_location_term_joins_the_users_pod_affinity() -> None:
    """On a ReadWriteOnce claim the operator's required pod affinity is added to the user's own terms."""
    doc = manifest()
    mine = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}
    doc["spec"]["trainer"]["pod"] = {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [mine]}}}
    terms = _workloads(make_job(doc))["trainer"]["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0] == mine and len(terms) == 2
    assert terms[1]["labelSelector"]["matchLabels"][names.LABEL_SHARES_CHECKPOINTS] == "tiny-arith"


def test_with_pod_overrides_is_the_identity_without_overrides() -> None:
    """A job without overrides renders exactly as before (the golden files hold it too); an empty
    override set changes nothing either."""
    import copy

    from rft_api.spec import PodOverrides, WorkerPodOverrides
    from rft_operator.builders.common import with_pod_overrides

    for w in _workloads(make_job(evaluator={"builtin": "math", "remote": True})).values():
        before = copy.deepcopy(w)
        assert with_pod_overrides(w, None) == before
        assert with_pod_overrides(copy.deepcopy(w), PodOverrides()) == before
        assert with_pod_overrides(copy.deepcopy(w), WorkerPodOverrides()) == before


def test_deep_merge_merges_maps_appends_lists_sets_scalars() -> None:
    from rft_operator.builders.common import deep_merge

    base = {"a": {"x": 1, "l": [1]}, "s": "old", "keep": True}
    assert deep_merge(base, {"a": {"y": 2, "l": [2]}, "s": "new"}) == {
        "a": {"x": 1, "y": 2, "l": [1, 2]}, "s": "new", "keep": True}
    assert base == {"a": {"x": 1, "l": [1]}, "s": "old", "keep": True}


def test_shared_memory_is_sized_where_the_role_has_one() -> None:
    """The trainer of several processes and vLLM already mount a memory-backed /dev/shm: shmSizeLimit
    sizes it (no second one); a trainer of one process gets one."""
    doc = manifest()
    doc["spec"]["trainer"]["processesPerNode"] = 2
    doc["spec"]["trainer"]["pod"] = {"shmSizeLimit": "1Gi"}
    pod = _workloads(make_job(doc))["trainer"]["spec"]["template"]["spec"]
    assert [v for v in pod["volumes"] if "emptyDir" in v and v["emptyDir"].get("medium")] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    assert sum(m["mountPath"] == "/dev/shm" for m in pod["containers"][0]["volumeMounts"]) == 1


def test_a_kueue_admission_adds_to_the_users_placement() -> None:
    from rft_operator.builders.workload import Placement

    doc = manifest()
    doc["spec"]["trainer"]["pod"] = _overrides("trainer")
    flavor = Placement(node_selector=(("flavor", "h100"),),
                       tolerations=((("key", "spot"), ("operator", "Exists")),))
    out = desired_children(make_job(doc), BuildContext(placements=(("trainer", flavor),)))
    pod = next(o for o in out if o["kind"] == "Job")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "trainer", "flavor": "h100"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["tolerations"][1] == {"key": "spot", "operator": "Exists"}


def test_reward_replicas_are_what_readiness_and_status_count() -> None:
    from rft_operator.topology import desired_replicas

    job = make_job(evaluator={"builtin": "code_sandbox"}, reward={"replicas": 3})
    assert desired_replicas(job.spec)["reward"] == 3
    (dep,) = [o for o in desired_children(job, BuildContext()) if o["kind"] == "Deployment"
              and o["metadata"]["name"].endswith("-reward")]
    assert dep["spec"]["replicas"] == 3
    assert desired_replicas(make_job(evaluator={"builtin": "code_sandbox"}).spec)["reward"] == 1
    assert desired_replicas(make_job().spec)["reward"] == 0


def test_vllm_typed_options_become_its_flags_and_tensor_parallel_follows_the_gpus() -> None:
    from rft_operator.builders.inference import command, vllm_options

    def job_with(inference: dict) -> Any:
        return make_job(model={"base": "builtin:tiny-vllm"},
                        inference={"engine": "vllm", "weightSync": "disk", **inference})

    assert vllm_options(job_with({})) == []
    assert vllm_options(job_with({"resources": {"limits": {"nvidia.com/gpu": 4}}})) == ["--tensor-parallel-size", "4"]
    full = job_with({"resources": {"limits": {"nvidia.com/gpu": 2}},
                     "vllm": {"tensorParallelSize": 2, "gpuMemoryUtilization": 0.85, "maxNumSeqs": 64,
                              "enablePrefixCaching": False}})
    assert vllm_options(full) == ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.85",
                                  "--max-num-seqs", "64", "--no-enable-prefix-caching"]
    cmd = command(full)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # behind the gate
    assert "--worker-extension-cls" in cmd and "--no-enable-prefix-caching" in cmd
