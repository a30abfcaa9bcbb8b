"""Cross-field rules declared once, enforced twice: as CEL in the CRD and in Python by the operator.

Each `Rule` carries a CEL expression (for `x-kubernetes-validations`), the message both layers show,
the field it concerns (relative to the object the rule is attached to) and a Python predicate over
the pydantic model with the same meaning. `@rules(...)` attaches them to a model class; the
`RuleChecked` base validates them after field validation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, model_validator
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Rule:
    cel: str
    message: str
    field: str  # JSONPath-like, relative: ".samplesPerPrompt"
    check: Callable[[Any], bool] | None  # None: CEL only (transition rules that need oldSelf)
    # what exactly failed, added to the message in Python (where the check sees more than CEL can say)
    explain: Callable[[Any], str] | None = None

    def crd(self) -> dict:
        out = {"rule": self.cel, "message": self.message}
        if self.field:
            out["fieldPath"] = self.field
            out["reason"] = "FieldValueInvalid"
        return out


def rules(*declared: Rule):
    """Class decorator attaching rules to a model (CEL in its schema, Python in its validator)."""

    def wrap(cls):
        cls.__rules__ = tuple(declared)
        return cls

    return wrap


class RuleChecked(BaseModel):
    __rules__: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self):
        for r in type(self).__rules__:
            if r.check is not None and not r.check(self):
                # The field travels in ctx so the error can name it, exactly like the CEL rule's fieldPath.
                message = r.message if r.explain is None else f"{r.explain(self)}; {r.message}"
                raise PydanticCustomError("rft_rule", "{message}", {"field": r.field, "message": message})
        return self
