"""The reward API's wire format (contract 3 in docs/architecture.md).

Request ``POST /v1/score``: ``{"samples": [entry, ...]}`` (``"episodes"`` is accepted too), where an
entry is either ``{"id"?, "sample": {...Sample fields...}, "item": {...Item fields...}}`` or an
evaluation row ``{"id"?, "messages": [...], "ground_truth": ..., "execution_metadata": {"extra":
{"prompt_ids", "completion_ids", "finish_reasons", "truncated"}}, "input_metadata"?: {...}}``.
With ``"group": true`` the entries are the samples of one task (the first entry's item is theirs) and
are scored together, so a groupwise evaluator sees them in one call.
Response: ``{"results": [{"id", "reward", "reason", "metrics", "error"}, ...]}`` in request order.
"""

from __future__ import annotations

from typing import Any, Mapping

from .types import Item, Sample, ScoreResult

__all__ = ["RequestError", "is_group", "parse_request", "parse_entry", "result_json"]


class RequestError(ValueError):
    """A malformed request; the message names the entry and field."""


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _from_row(row: Mapping[str, Any]) -> tuple[Sample, Item]:
    extra = ((row.get("execution_metadata") or {}).get("extra") or {})
    input_meta = row.get("input_metadata") or {}
    completion_ids = extra.get("completion_ids")
    if isinstance(completion_ids, list) and completion_ids and isinstance(completion_ids[0], list):
        completion_ids = completion_ids[0]  # one sample per row: the first (only) completion
    sample = Sample.from_any({
        "id": row.get("id"),
        "messages": row.get("messages") or [],
        "prompt_ids": extra.get("prompt_ids"),
        "completion_ids": completion_ids,
        "finish_reason": _first(extra.get("finish_reasons", extra.get("finish_reason"))),
        "truncated": bool(_first(extra.get("truncated", False))),
    })
    meta = input_meta.get("dataset_info") if isinstance(input_meta.get("dataset_info"), Mapping) else input_meta
    item = Item.from_any({"ground_truth": row.get("ground_truth"), "metadata": dict(meta or {}),
                          "domain": (meta or {}).get("domain") or "default",
                          "task_id": (meta or {}).get("task_id") or input_meta.get("row_id")})
    return sample, item


def parse_entry(entry: Any) -> tuple[str | None, Sample, Item]:
    """(id, sample, item) of one request entry; raises ValueError naming the field."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"must be an object, got {type(entry).__name__}")
    if "sample" in entry:
        sample = Sample.from_any(entry["sample"])
        item = Item.from_any(entry.get("item"))
    elif "messages" in entry:
        sample, item = _from_row(entry)
    else:
        raise ValueError("needs 'sample' and 'item', or an evaluation row with 'messages' and 'ground_truth'")
    eid = entry.get("id", sample.id)
    return (None if eid is None else str(eid)), sample, item


def is_group(body: Any) -> Any:
    """The request's ``group`` field (False when absent); :func:`parse_request` refuses a non-bool."""
    return body.get("group", False) if isinstance(body, Mapping) else False


def parse_request(body: Any) -> list[tuple[str | None, Sample, Item]]:
    """All entries of a score request; raises RequestError naming the first bad entry."""
    entries: Any
    if isinstance(body, list):
        entries, key = body, "samples"
    elif isinstance(body, Mapping):
        key = "samples" if "samples" in body else "episodes"
        entries = body.get(key)
    else:
        raise RequestError("request body must be a JSON object with 'samples'")
    if not isinstance(entries, list):
        raise RequestError("request field 'samples' must be a list")
    if not isinstance(is_group(body), bool):
        raise RequestError("request field 'group' must be true or false")
    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(parse_entry(entry))
        except ValueError as exc:
            raise RequestError(f"{key}[{i}]: {exc}") from None
    return out


def result_json(entry_id: str | None, result: ScoreResult) -> dict[str, Any]:
    """One response element."""
    return {"id": entry_id, **result.to_dict()}
