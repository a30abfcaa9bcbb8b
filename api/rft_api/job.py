"""The RFTJob object: envelope, manifest parsing with field-named errors, and root-level rules."""
from __future__ import annotations

from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .constants import API_VERSION, KIND
from .rules import Rule
from .spec import RFTJobSpec
from .status import RFTJobStatus

NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = 40  # children append suffixes such as "-inference" and must stay DNS-1035 labels

_STARTED = "!has(oldSelf.status) || !has(oldSelf.status.startTime)"

# Rules on the whole object. The transition rules (oldSelf) are CEL only: the API server enforces them.
ROOT_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"self.metadata.name.matches('{NAME_PATTERN}') && size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        message=f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
                "(lower case letters, digits and '-', starting with a letter)",
        field="",  # the API server accepts no fieldPath into metadata; the message names the field
        check=None,
    ),
    Rule(
        cel=f"{_STARTED} || self.spec.model == oldSelf.spec.model",
        message="spec.model may not change once the job has started",
        field=".spec.model", check=None,
    ),
    Rule(
        cel=f"{_STARTED} || self.spec.trainer.algorithm == oldSelf.spec.trainer.algorithm",
        message="spec.trainer.algorithm may not change once the job has started",
        field=".spec.trainer.algorithm", check=None,
    ),
    Rule(
        cel=f"{_STARTED} || (has(self.spec.model.tokenizer) == has(oldSelf.spec.model.tokenizer) && "
            "(!has(self.spec.model.tokenizer) || self.spec.model.tokenizer == oldSelf.spec.model.tokenizer))",
        message="spec.model.tokenizer may not change once the job has started",
        field=".spec.model.tokenizer", check=None,
    ),
    Rule(
        # The claim holding the checkpoints may never change: switching to or from an existing claim
        # would orphan (or, before this rule, delete) the checkpoints of the running job.
        cel="(has(self.spec.checkpoint) && has(self.spec.checkpoint.existingClaim) ? "
            "self.spec.checkpoint.existingClaim : '') == (has(oldSelf.spec.checkpoint) && "
            "has(oldSelf.spec.checkpoint.existingClaim) ? oldSelf.spec.checkpoint.existingClaim : '')",
        message="spec.checkpoint.existingClaim may not change: the claim holds the job's checkpoints "
                "(create a new RFTJob to use another claim)",
        field=".spec.checkpoint.existingClaim", check=None,
    ),
)


class InvalidSpec(ValueError):
    """A manifest that does not validate; the message names every offending field."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


class RFTJob(BaseModel):
    """A parsed RFTJob (metadata kept as a plain dict)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any]
    spec: RFTJobSpec
    status: Optional[RFTJobStatus] = None

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def namespace(self) -> str:
        return self.metadata.get("namespace", "default")


def field_path(loc: tuple) -> str:
    """A pydantic error location as a field path: ``spec.rollout.topP``, ``evaluators[0].builtin``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part.startswith("function-") or part in ("str", "int", "float")):
            continue  # pydantic's union-branch markers, not fields
        else:
            out += ("." if out else "") + part
    return out


def _problems(err: ValidationError, prefix: str) -> list[str]:
    out = []
    for e in err.errors():
        field = e.get("ctx", {}).get("field", "") if e["type"] == "rft_rule" else ""
        where = ".".join(x for x in (prefix, field_path(tuple(e["loc"])), field.lstrip(".")) if x)
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        out.append(f"{where}: {msg}" if where else msg)
    return out


def validate_spec(spec: dict[str, Any]) -> RFTJobSpec:
    """Validate a spec dict (camelCase keys) with the same rules the CRD enforces; raises InvalidSpec."""
    try:
        return RFTJobSpec.model_validate(spec)
    except ValidationError as e:
        raise InvalidSpec(_problems(e, "spec")) from None


def validate_name(name: str) -> None:
    import re

    if not re.match(NAME_PATTERN, name or "") or len(name) > MAX_NAME_LENGTH:
        raise InvalidSpec([f"metadata.name: {ROOT_RULES[0].message}"])


def parse_manifest(doc: dict[str, Any] | str) -> RFTJob:
    """Parse an RFTJob manifest (dict or YAML text); raises InvalidSpec naming each bad field."""
    if isinstance(doc, str):
        doc = yaml.safe_load(doc)
    if not isinstance(doc, dict):
        raise InvalidSpec(["manifest: expected a mapping"])
    problems = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: expected {API_VERSION}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        problems.append(f"kind: expected {KIND}, got {doc.get('kind')!r}")
    meta = doc.get("metadata") or {}
    try:
        validate_name(meta.get("name", ""))
    except InvalidSpec as e:
        problems += e.problems
    try:
        spec = validate_spec(doc.get("spec") or {})
    except InvalidSpec as e:
        problems += e.problems
        spec = None
    if problems:
        raise InvalidSpec(problems)
    return RFTJob(metadata=dict(meta), spec=spec, status=None)


def load_manifest(path: str) -> RFTJob:
    """Read and parse the first RFTJob in a YAML file."""
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    jobs = [d for d in docs if d.get("kind") == KIND]
    if not jobs:
        raise InvalidSpec([f"{path}: no {KIND} document found"])
    return parse_manifest(jobs[0])
