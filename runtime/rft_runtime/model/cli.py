"""``rft make-tiny-model DIR [--seed S] [--warm-start-steps N] [--dataset NAME]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

__all__ = ["make_tiny_model_cli", "build_parser"]


def build_parser(prog: str = "rft make-tiny-model") -> argparse.ArgumentParser:
    """The argument parser of the subcommand (the integrator may attach it as a subparser)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Build the tiny Qwen2-architecture model and byte-level tokenizer offline, "
                    "deterministically, in Hugging Face format.",
    )
    p.add_argument("dir", help="output directory (created; existing model files are overwritten)")
    p.add_argument("--seed", type=int, default=0, help="random-init and warm-start seed (default 0)")
    p.add_argument("--warm-start-steps", type=int, default=0,
                   help="supervised warm-start steps on --dataset (default 0: random weights; "
                        "700 steps on arithmetic gives the same model as builtin:tiny)")
    p.add_argument("--dataset", default="arithmetic", help="builtin dataset for the warm start")
    return p


def make_tiny_model_cli(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand with ``argv`` (the arguments after ``make-tiny-model``); returns an exit code.

    Prints one JSON line: ``{"path", "seed", "warm_start": null | {steps, final_loss, seconds}}``.
    """
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.warm_start_steps < 0:
        print("error: --warm-start-steps must be >= 0", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    from ..data.registry import list_datasets
    from .builtin import DEFAULT_WARM_START_DATASET, WARM_START_RECIPE
    from .tiny import make_tiny_model
    from .warm_start import warm_start

    if args.warm_start_steps and args.dataset not in list_datasets():
        print(f"error: unknown --dataset {args.dataset!r}; known: {', '.join(list_datasets())}", file=sys.stderr)
        return 2
    hf_logging.disable_progress_bar()
    path = make_tiny_model(args.dir, args.seed)
    summary: dict = {"path": str(path), "seed": args.seed, "warm_start": None}
    if args.warm_start_steps:
        recipe = dict(WARM_START_RECIPE)
        if args.dataset != DEFAULT_WARM_START_DATASET:
            recipe.pop("dataset_options")  # those options belong to the default dataset
        r = warm_start(path, args.dataset, args.warm_start_steps, args.seed, path, **recipe)
        summary["warm_start"] = {"dataset": args.dataset, "steps": r.steps,
                                 "final_loss": r.final_loss, "seconds": round(r.seconds, 2)}
    print(json.dumps(summary))
    return 0
