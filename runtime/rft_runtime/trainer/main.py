"""``rft trainer --config FILE``: the trainer role's entry point (the trainer pod runs it).

Resumes from the latest complete checkpoint under ``paths.checkpoints`` when there is one (a
restarted trainer continues), serves the coordinator, trains ``trainer.maxSteps`` steps, writes
the final checkpoint and a ``done`` progress record, and exits 0 (also when the checkpoint it
resumed from already completes the run: an attempt killed after its final checkpoint). SIGTERM/SIGINT stop it after
the current step with a checkpoint of the last completed step (exit status 143 / 130).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from rft_api import runtime

from .state import ResumeError
from .trainer import StopRequested, Trainer

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rft trainer", description="Run the trainer role (coordinator + learner).")
    p.add_argument("--config", required=True, help="the resolved runtime config (config.json)")
    p.add_argument("--max-steps", type=int, default=None, help="override trainer.maxSteps")
    p.add_argument("--no-resume", action="store_true", help="start fresh even if checkpoints exist")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO (the inference version check alone is one line every 2 s).
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        cfg = runtime.load(args.config)
    except runtime.ConfigError as e:
        print(f"rft trainer: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    trainer = Trainer(cfg, resume=not args.no_resume, max_steps=args.max_steps, should_stop=stop.is_set)
    try:
        trainer.setup()
    except ResumeError as e:
        print(f"rft trainer: {e}", file=sys.stderr)
        return 2
    try:
        while not trainer.finished and not stop.is_set():
            try:
                row = trainer.step()
            except StopRequested:
                break
            log.info("step %d/%d reward %.3f", row["step"], trainer.max_steps, row.get("reward_mean") or 0.0)
        if trainer.finished:
            trainer.finish()
            return 0
        trainer.stop(checkpoint=True)
        return 128 + (received[0] if received else signal.SIGTERM)
    finally:
        trainer.close()
