"""``rft trainer --config FILE``: the trainer role's entry point (each trainer pod runs it).

The pod is node ``$JOB_COMPLETION_INDEX`` (0 without it) of ``trainer.nodes``; it runs local rank 0
and starts local ranks ``1..processesPerNode-1`` (:mod:`.launch`); all ``nodes × processesPerNode``
ranks form one torch.distributed process group (:mod:`.distributed`). Global rank 0 is the trainer
proper: it resumes from the latest complete checkpoint under ``paths.checkpoints`` when there is one
(a restarted trainer continues), serves the coordinator, trains ``trainer.maxSteps`` steps, writes
the final checkpoint and a ``done`` progress record, and exits 0 (also when the checkpoint it
resumed from already completes the run: an attempt killed after its final checkpoint). It exits 2, the
terminal status, with a reason the operator fails the job with (:mod:`.terminal`), when its config,
dataset, model or checkpoint cannot be used, when the checkpoints it should resume from are gone, when
the checkpoint volume is full, or when training stopped being finite (:mod:`.finite`: the checkpoints
stay as they were). SIGTERM/SIGINT stop it after
the current step with a checkpoint of the last completed step (exit status 143 / 130). Every other
rank follows rank 0 (:func:`.trainer.follow`) and ignores SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from rft_api import runtime

from .terminal import TERMINAL_EXIT, terminal_line, terminal_reason
from .trainer import StopRequested, Trainer

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rft trainer", description="Run the trainer role (coordinator + learner).")
    p.add_argument("--config", required=True, help="the resolved runtime config (config.json)")
    p.add_argument("--max-steps", type=int, default=None, help="override trainer.maxSteps")
    p.add_argument("--no-resume", action="store_true", help="start fresh even if checkpoints exist")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--node", type=int, default=None, help="this node's index (default: $JOB_COMPLETION_INDEX or 0)")
    p.add_argument("--local-rank", type=int, default=0, help="the process's rank on its node (>0: started by local rank 0)")
    p.add_argument("--rendezvous-port", type=int, default=None, help="override ports.rendezvous")
    p.add_argument("--threads", type=int, default=None, help="override trainer.threads")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO (the inference version check alone is one line every 2 s).
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        cfg = runtime.load(args.config)
    except runtime.ConfigError as e:
        print(f"rft trainer: InvalidConfig: {e}", file=sys.stderr)
        return 2
    if args.threads:
        cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"threads": args.threads})})
    from . import distributed, launch
    from .compiled import CompileUnavailable, wants_compile

    try:
        ctx = distributed.context_for(cfg, args.local_rank, args.node, args.rendezvous_port)
        if cfg.spec.trainer.compile == "always":  # refused before any rank starts (auto only logs)
            wants_compile("always", ctx.device)
    except (ValueError, CompileUnavailable) as e:
        print(f"rft trainer: InvalidConfig: {e}", file=sys.stderr)
        return 2
    if args.local_rank > 0 or not ctx.is_main:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    children = []
    if args.local_rank == 0:
        node = ctx.rank // cfg.spec.trainer.processes()
        children = launch.start_ranks(args.config, [(node, r) for r in range(1, cfg.spec.trainer.processes())],
                                      port=args.rendezvous_port, threads=args.threads)
    try:
        if not ctx.is_main:
            from .trainer import follow

            follow(cfg, ctx)
            return 0
        return _run(cfg, args, ctx)
    finally:
        rc = launch.wait_ranks(children)
        if rc:
            log.error("a trainer rank on this node exited with status %d", rc)


def _run(cfg: runtime.RuntimeConfig, args: argparse.Namespace, ctx: object) -> int:
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    trainer = Trainer(cfg, resume=not args.no_resume, max_steps=args.max_steps, should_stop=stop.is_set,
                      dist=ctx)  # type: ignore[arg-type]
    try:
        return _train(trainer, stop, received)
    except Exception as e:  # noqa: BLE001 - a terminal error is told and exits 2; the rest propagates
        reason = terminal_reason(e)
        if reason is None:
            raise
        print(terminal_line(reason, e), file=sys.stderr)
        return TERMINAL_EXIT
    finally:
        trainer.close()


def _train(trainer: Trainer, stop: threading.Event, received: list[int]) -> int:
    trainer.setup()
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


if __name__ == "__main__":
    sys.exit(main())
