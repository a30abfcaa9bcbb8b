"""Generates the RFTJob CustomResourceDefinition from the pydantic models (the one source of truth).

pydantic's JSON schema is turned into a Kubernetes structural schema: references inlined, nullable
unions collapsed to the optional type, numeric exclusive bounds in OpenAPI v3 form, free-form maps
marked to preserve unknown fields, int-or-string quantities marked, and each model's `@rules` added as
`x-kubernetes-validations`.
"""
from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from . import constants as C
from .job import ROOT_RULES
from .spec import RFTJobSpec
from .status import RFTJobStatus

_DROP = {"title", "additionalProperties"}


def _model_classes(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from root, by class name (pydantic's $defs keys)."""
    import typing

    found: dict[str, type[BaseModel]] = {}

    def visit(tp):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for f in tp.model_fields.values():
                visit(f.annotation)
            return
        for arg in typing.get_args(tp):
            visit(arg)

    visit(root)
    return found


def _field_defaults(cls: type[BaseModel]) -> dict[str, Any]:
    """Defaults of default_factory fields (pydantic leaves them out of the schema)."""
    out = {}
    for name, f in cls.model_fields.items():
        if f.default_factory is None:
            continue
        value = f.default_factory()  # type: ignore[call-arg]  # no factory here takes the validated data
        alias = f.alias or name
        # A model default is written out in full: the API server validates defaults with the CEL rules
        # of the object itself, before the nested defaults would fill an empty object.
        out[alias] = value.model_dump(by_alias=True, exclude_none=True) if isinstance(value, BaseModel) else value
    return out


def _convert(node: Any, defs: dict, classes: dict[str, type[BaseModel]]) -> Any:
    if isinstance(node, list):
        return [_convert(x, defs, classes) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        merged = {**copy.deepcopy(defs[name]), **{k: v for k, v in node.items() if k != "$ref"}}
        out = _convert(merged, defs, classes)
        cls = classes.get(name)
        if cls is not None:
            rules = [r.crd() for r in getattr(cls, "__rules__", ())]
            if rules:
                out["x-kubernetes-validations"] = rules
            for key, default in _field_defaults(cls).items():
                out.setdefault("properties", {}).get(key, {}).setdefault("default", default)
        return out
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            rest.pop("default")
        if len(branches) == 1:
            return _convert({**branches[0], **rest}, defs, classes)
        types = sorted(b.get("type") for b in branches)
        if types == ["integer", "string"]:
            out = {k: _convert(v, defs, classes) for k, v in rest.items() if k not in _DROP}
            out["x-kubernetes-int-or-string"] = True
            return out
        raise ValueError(f"cannot express union {branches} in a structural schema")
    out = {}
    for k, v in node.items():
        if k in _DROP or k == "$defs":
            continue
        if k == "properties":
            out[k] = {pk: _convert(pv, defs, classes) for pk, pv in v.items()}
        else:
            out[k] = _convert(v, defs, classes)
    if "const" in out:  # a one-value Literal: structural schemas have no const
        out["enum"] = [out.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            out[plain] = node[bound]
            out[bound] = True
    if node.get("type") == "object" and "properties" in node and node.get("additionalProperties") is True:
        out["x-kubernetes-preserve-unknown-fields"] = True  # a model that keeps extra keys
    if node.get("type") == "object" and "properties" not in node:
        extra = node.get("additionalProperties")
        if extra is True or extra == {}:
            # A map of arbitrary values: CEL sees map(string, dyn), so rules can test `'key' in self.x`.
            out["additionalProperties"] = {"x-kubernetes-preserve-unknown-fields": True}
        elif isinstance(extra, dict):
            out["additionalProperties"] = _convert(extra, defs, classes)
    return out


def _schema_of(model: type[BaseModel]) -> dict:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    defs[model.__name__] = raw
    return _convert({"$ref": f"#/$defs/{model.__name__}"}, defs, _model_classes(model))


def _status_schema() -> dict:
    schema = _schema_of(RFTJobStatus)
    conds = schema["properties"]["conditions"]
    conds["x-kubernetes-list-type"] = "map"
    conds["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def openapi_schema() -> dict:
    """The structural openAPIV3Schema of the RFTJob CRD."""
    return {
        "type": "object",
        "description": "RFTJob: a managed reinforcement fine-tuning job.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _schema_of(RFTJobSpec),
            "status": _status_schema(),
        },
        "x-kubernetes-validations": [r.crd() for r in ROOT_RULES],
    }


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.rewardMean"},
    {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.lastCheckpoint.step"},
    {"name": "Algorithm", "type": "string", "jsonPath": ".spec.trainer.algorithm", "priority": 1},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.base", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{C.PLURAL}.{C.GROUP}"},
        "spec": {
            "group": C.GROUP,
            "names": {
                "kind": C.KIND, "listKind": f"{C.KIND}List", "plural": C.PLURAL,
                "singular": C.SINGULAR, "shortNames": list(C.SHORT_NAMES), "categories": ["all", "rft"],
            },
            "scope": "Namespaced",
            "versions": [{
                "name": C.VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": openapi_schema()},
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
            }],
        },
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper, data):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


def crd_yaml() -> str:
    """The CRD as YAML, byte-stable (what `rft crds` prints and crds/rftjob.yaml holds)."""
    header = "# Generated by `rft crds` from api/rft_api (pydantic models). Do not edit.\n"
    return header + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
