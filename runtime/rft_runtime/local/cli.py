"""``rft run JOB.yaml [--out DIR] [--resume] [--address RAY_ADDRESS] [--max-steps N] [--threads N] [--engine-process]
[--no-pin-cores]``."""

from __future__ import annotations

import argparse
import os
import sys


def known_errors() -> tuple[type[BaseException], ...]:
    """The errors ``rft run`` reports in one line (exit 2). Their modules import no torch: the driver
    needs none (the roles import it in their own processes)."""
    from rft_api.runtime import ConfigError

    from ..coordinator import CollectTimeout
    from ..data import DatasetError
    from ..model.loading import ModelLoadError
    from ..rewards.options import ConfigError as EvaluatorConfigError
    from ..trainer.checkpoint import CheckpointError, ResumeError
    from ..trainer.finite import NonFiniteTraining, NonFiniteWeights
    from ..trainer.publisher import PublishError
    from .runner import LocalRunError

    return (LocalRunError, ResumeError, CheckpointError, ConfigError, DatasetError, PublishError, CollectTimeout,
            EvaluatorConfigError, FileNotFoundError, NonFiniteTraining, NonFiniteWeights, ModelLoadError)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rft run", description="Run an RFTJob manifest on this machine: the roles "
                                "start as Ray actors with the builtin inference server.")
    p.add_argument("manifest", help="RFTJob YAML (the file the operator takes)")
    p.add_argument("--out", default=None, help="output directory (default: runs/<job name>)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                   help="attach to a running Ray cluster: HOST:PORT of its head, or ray://HOST:PORT of its Ray "
                        "Client server (default: $RAY_ADDRESS; without either, a Ray of its own on this machine)")
    p.add_argument("--max-steps", type=int, default=None, help="override trainer.maxSteps")
    p.add_argument("--threads", type=int, default=1, help="torch threads per role (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--engine-process", action="store_true",
                   help="each inference server runs its engine in a child process, as rft serve does (default: "
                        "in a thread of the server's actor; on 2 cores the sample job's steps are no faster in "
                        "a process, and it costs a second interpreter of about 0.8 GB)")
    p.add_argument("--no-pin-cores", action="store_true",
                   help="let the system place every role's process (default: with rollout.maxStaleness above 0 "
                        "and a core to spare, the trainer keeps to cores of its own and the other roles to the rest)")
    p.add_argument("--allow-unauthenticated-ray", action="store_true",
                   help="with --address: attach to a Ray cluster whose nodes run without Ray's token authentication "
                        "(refused by default: whoever reaches its ports could run code next to the roles)")
    args = p.parse_args(argv)
    if args.address == "local":  # Ray's own spelling of "start one here"
        args.address = None
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from rft_api.job import InvalidSpec

    from .runner import RunOptions, run_local

    known = known_errors()

    try:
        result = run_local(RunOptions(args.manifest, args.out, args.resume, args.address, args.max_steps,
                                      progress_bar=not args.no_progress, threads=args.threads,
                                      engine_process=args.engine_process, pin_cores=not args.no_pin_cores,
                                      allow_unauthenticated_ray=args.allow_unauthenticated_ray))
    except InvalidSpec as e:
        print(f"rft run: {args.manifest}: invalid RFTJob", file=sys.stderr)
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    except known as e:
        print(f"rft run: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rft run: aborted", file=sys.stderr)
        return 130
    return result.exit_code
