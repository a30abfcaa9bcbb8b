"""`rft`: the user CLI. Subcommands import their modules lazily so `rft crds` needs no torch."""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module:function taking argv, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "crds": ("rft_runtime.cli:_crds", "print the RFTJob CustomResourceDefinition"),
    "validate": ("rft_runtime.cli:_validate", "validate RFTJob manifests"),
    "docs": ("rft_runtime.cli:_docs", "print the API reference (docs/api.md)"),
    "plan": ("rft_runtime.cli:_plan",
             "print a job's per-rank trainer memory and whether it fits (rft plan JOB.yaml [--device-memory 80GiB])"),
    "run": ("rft_runtime.local.cli:main", "run an RFTJob manifest on this machine (roles as Ray actors)"),
    "samples": ("rft_runtime.samples_view:main",
                "print a local run's sampled completions, rewards and reasons (rft samples DIR [--step N])"),
    "trainer": ("rft_runtime.trainer.main:main", "the trainer role: coordinator + learner (--config FILE)"),
    "rollout": ("rft_runtime.rollout.loop:main",
                "the rollout role: lease tasks, sample, score, post episodes (--config FILE)"),
    "make-tiny-model": ("rft_runtime.model.cli:make_tiny_model_cli",
                        "build the tiny Qwen2-architecture model and byte tokenizer offline"),
    "model": ("rft_runtime.model.export:model_cli", "model utilities (export a builtin model for vLLM)"),
    "serve": ("rft_runtime.serve.server:main", "the builtin vLLM-compatible inference server"),
    "gate": ("rft_runtime.gate.main:main", "the authenticated front of a vLLM server that loads full policy versions"),
    "reward": ("rft_runtime.rewards.server:main", "the reward role: serve the reward API (--config FILE)"),
    "fetch": ("rft_runtime.fetching:main", "fetch a job's hf:// and s3:// model and datasets (--config FILE)"),
}


def _crds(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="rft crds", description=COMMANDS["crds"][1]).parse_args(argv)
    from rft_api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _docs(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="rft docs", description=COMMANDS["docs"][1]).parse_args(argv)
    from rft_api.docs import api_markdown

    sys.stdout.write(api_markdown())
    return 0


def _validate(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rft validate", description=COMMANDS["validate"][1])
    p.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    from rft_api.job import InvalidSpec, load_manifest

    bad = 0
    for f in args.files:
        try:
            job = load_manifest(f)
            print(f"{f}: valid RFTJob {job.name}")
        except InvalidSpec as e:
            bad += 1
            print(f"{f}: invalid", file=sys.stderr)
            for problem in e.problems:
                print(f"  {problem}", file=sys.stderr)
    return 1 if bad else 0


def _plan(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rft plan", description=COMMANDS["plan"][1])
    p.add_argument("file", help="an RFTJob manifest")
    p.add_argument("--config", help="the model's config.json (or its directory), for a model not on this machine")
    p.add_argument("--device-memory", help="memory of each trainer device (a quantity: 80GiB, 80Gi, 141G); "
                   "default: unknown on GPUs, the trainer pod's memory limit per process on the CPU")
    p.add_argument("--device", choices=("gpu", "cpu"), help="default: gpu when the trainer asks for nvidia.com/gpu")
    args = p.parse_args(argv)
    from rft_api.job import InvalidSpec, load_manifest

    from .trainer.memory_plan import run_plan

    try:
        job = load_manifest(args.file)
    except InvalidSpec as e:
        print("\n".join([f"{args.file}: invalid", *e.problems]), file=sys.stderr)
        return 2
    return run_plan(job.spec, args.config, args.device_memory, args.device)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: rft <command> [args]\n\ncommands:")
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:<18} {help_}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rft: unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][0].split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
