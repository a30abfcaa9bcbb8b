"""The committed CRD is the generated one, and the schema is structural and bounded."""
from pathlib import Path

import yaml

from rft_api import constants as C
from rft_api.crd import crd, crd_yaml

ROOT = Path(__file__).resolve().parents[2]


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.get("properties", {}).items():
            yield from _walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _schema():
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_generated():
    committed = (ROOT / "crds" / "rftjob.yaml").read_text()
    assert committed == crd_yaml(), "crds/rftjob.yaml is stale: run `make crds`"


def test_names_and_printer_columns():
    spec = crd()["spec"]
    assert spec["group"] == "rft.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "RFTJob" and spec["names"]["plural"] == "rftjobs"
    assert "rft" in spec["names"]["shortNames"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    cols = [c["name"] for c in version["additionalPrinterColumns"]]
    for c in ("Phase", "Step", "Reward", "Checkpoint", "Age"):
        assert c in cols


def test_every_string_and_list_is_bounded():
    unbounded = []
    for path, node in _walk(_schema()["properties"]["spec"]):
        if not isinstance(node, dict):
            continue
        if node.get("type") == "string" and "maxLength" not in node and "enum" not in node:
            unbounded.append(path)
        if node.get("type") == "array" and "maxItems" not in node:
            unbounded.append(path)
    assert unbounded == []


def test_structural_no_unions_no_refs():
    text = yaml.safe_dump(crd())
    assert "$ref" not in text and "anyOf: \n- type: 'null'" not in text
    for path, node in _walk(_schema()):
        if isinstance(node, dict) and "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), path
        if isinstance(node, dict) and path.count(".") >= 2:
            assert "type" in node or node.get("x-kubernetes-int-or-string"), path


def test_leaf_fields_have_descriptions():
    missing = [p for p, n in _walk(_schema()["properties"]["spec"])
               if isinstance(n, dict) and p.count(".") >= 2 and not n.get("description")
               and not p.endswith("{}") and not p.endswith("[]")]
    assert missing == []


def test_enums_match_constants():
    spec = _schema()["properties"]["spec"]["properties"]
    trainer = spec["trainer"]["properties"]
    assert tuple(trainer["algorithm"]["enum"]) == C.ALGORITHMS
    assert tuple(trainer["advantageEstimator"]["enum"]) == C.ADVANTAGE_ESTIMATORS
    assert tuple(trainer["policyLoss"]["enum"]) == C.POLICY_LOSSES
    assert tuple(trainer["lossAggregation"]["enum"]) == C.LOSS_AGGREGATIONS
    assert tuple(trainer["kl"]["properties"]["estimator"]["enum"]) == C.KL_ESTIMATORS
    assert tuple(spec["evaluator"]["properties"]["builtin"]["enum"]) == C.BUILTIN_EVALUATORS
    assert tuple(spec["inference"]["properties"]["engine"]["enum"]) == C.ENGINES
    assert tuple(spec["dataset"]["properties"]["train"]["properties"]["builtin"]["enum"]) == C.BUILTIN_DATASETS
    status = _schema()["properties"]["status"]["properties"]
    assert tuple(status["phase"]["enum"]) == C.PHASES
    assert tuple(status["conditions"]["items"]["properties"]["type"]["enum"]) == C.CONDITION_TYPES


def test_cel_rules_carry_messages_and_fields():
    rules = [n["x-kubernetes-validations"] for _, n in _walk(_schema())
             if isinstance(n, dict) and "x-kubernetes-validations" in n]
    flat = [r for rs in rules for r in rs]
    assert len(flat) >= 15
    for r in flat:
        assert r["message"] and r["rule"]
    assert any("oldSelf" in r["rule"] for r in flat), "immutability rules missing"


def test_chart_crd_is_the_generated_one():
    assert (ROOT / "charts" / "rft-operator" / "crds" / "rftjob.yaml").read_text() == crd_yaml()


def test_api_reference_is_generated():
    from rft_api.docs import api_markdown

    assert (ROOT / "docs" / "api.md").read_text() == api_markdown(), "docs/api.md is stale: run `make crds`"
