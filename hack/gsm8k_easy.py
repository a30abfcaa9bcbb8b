"""Writes GSM8K's easiest problems, those solved in one or two arithmetic operations, as the training and
held-out sets of examples/09-real-model.yaml (``make real-model-data`` runs it).

Input: GSM8K as OpenAI publishes it (``train.jsonl`` and ``test.jsonl``, rows ``{"question", "answer"}``, the
answer a worked solution ending in ``#### N``), by default ``../shared/datasets/gsm8k`` beside the checkout
(or ``$RFT_SHARED_DIR/datasets/gsm8k``). A solution's calculator annotations ``<<48/2=24>>`` are its
operations: the operators (``+ - * /``) written left of ``=`` in all of them, counted. A problem whose
solution has between ``--min-ops`` and ``--max-ops`` of them (default 1 and 2) is kept; one without any
annotation is not (its count is unknown).

Output, in ``OUT`` (default ``runs/claims/datasets/gsm8k-easy``):

- ``train.jsonl`` from GSM8K's train split, ``test.jsonl`` from its test split: the rows as GSM8K has them
  (``question``, ``answer``) plus ``id`` (``gsm8k-<split>-<row>``, the 0-based row of the source file) and
  ``operations``, in the source's order. The job maps the columns with ``fields: {prompt: question,
  groundTruth: answer}``; ``id`` is the task id, ``operations`` stays in the task's metadata.
- A training problem whose question (whitespace and case folded) is also a test question is dropped: the
  held-out set is never trained on.
- ``README.md``: where the files came from and how many rows each holds.

Deterministic: the same input gives byte-identical files. Standard library only.

    python3 hack/gsm8k_easy.py [--src DIR] [--out DIR] [--min-ops 1] [--max-ops 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "runs" / "claims" / "datasets" / "gsm8k-easy"
ANNOTATION = re.compile(r"<<([^<>=]*)=[^<>]*>>")
OPERATOR = re.compile(r"(?<=[\d.%)])\s*[-+*/]")  # binary: after a number, a percent sign or a bracket
SPLITS = ("train", "test")


def default_src() -> Path:
    shared = os.environ.get("RFT_SHARED_DIR")
    return (Path(shared) if shared else ROOT.parent / "shared") / "datasets" / "gsm8k"


def operations(answer: str) -> int:
    """The arithmetic operations of a GSM8K solution: binary operators left of ``=`` in its ``<<...>>``
    calculator annotations (0 when it has none)."""
    return sum(len(OPERATOR.findall(expr.replace(" ", ""))) for expr in ANNOTATION.findall(answer))


def _key(question: str) -> str:
    return " ".join(question.lower().split())


def read_split(src: Path, split: str) -> list[dict]:
    path = src / f"{split}.jsonl"
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows):
        if not isinstance(row.get("question"), str) or "####" not in str(row.get("answer", "")):
            raise SystemExit(f"{path}:{i + 1}: not a GSM8K row (question, answer ending in '#### N')")
    return rows


def select(rows: list[dict], split: str, min_ops: int, max_ops: int, exclude: set[str]) -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        n = operations(row["answer"])
        if min_ops <= n <= max_ops and _key(row["question"]) not in exclude:
            out.append({"id": f"gsm8k-{split}-{i}", "question": row["question"], "answer": row["answer"],
                        "operations": n})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> str:
    """Write ``rows`` (atomically: a temporary file renamed) and return the file's sha256."""
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, default=default_src(), help="GSM8K directory (train.jsonl, test.jsonl)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    p.add_argument("--min-ops", type=int, default=1)
    p.add_argument("--max-ops", type=int, default=2)
    args = p.parse_args(argv)
    if not 1 <= args.min_ops <= args.max_ops:
        p.error("need 1 <= --min-ops <= --max-ops")
    source = {s: read_split(args.src, s) for s in SPLITS}
    test = select(source["test"], "test", args.min_ops, args.max_ops, set())
    held_out = {_key(r["question"]) for r in source["test"]}  # every test question, not only the kept ones
    train = select(source["train"], "train", args.min_ops, args.max_ops, held_out)
    dropped = sum(args.min_ops <= operations(r["answer"]) <= args.max_ops for r in source["train"]) - len(train)
    args.out.mkdir(parents=True, exist_ok=True)
    sums = {"train": write_jsonl(args.out / "train.jsonl", train), "test": write_jsonl(args.out / "test.jsonl", test)}
    readme = (f"# GSM8K, {args.min_ops} to {args.max_ops} operations\n\n"
              f"Written by `hack/gsm8k_easy.py` from GSM8K (MIT, OpenAI): the problems whose solution has "
              f"{args.min_ops} to {args.max_ops} arithmetic operations in its `<<...>>` calculator annotations.\n\n"
              f"| file | rows | from | sha256 |\n|---|---|---|---|\n"
              f"| train.jsonl | {len(train)} | train.jsonl ({len(source['train'])} rows; {dropped} dropped as "
              f"test questions) | {sums['train']} |\n"
              f"| test.jsonl | {len(test)} | test.jsonl ({len(source['test'])} rows) | {sums['test']} |\n")
    (args.out / "README.md").write_text(readme)
    print(f"{args.out}: train.jsonl {len(train)} rows, test.jsonl {len(test)} rows "
          f"({args.min_ops}-{args.max_ops} operations; {dropped} training rows dropped as test questions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
