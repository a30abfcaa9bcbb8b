"""``rft gate``: the vLLM gate's command line (the inference pod's front container)."""

from __future__ import annotations

import argparse
import logging
import os

from aiohttp import web

from .. import auth
from .app import Gate, create_app
from .extension import install


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rft gate", description="The job's authenticated front door to a vLLM "
                                "server on this pod's loopback; loads full policy versions into it.")
    p.add_argument("--host", default=os.environ.get("RFT_BIND_HOST", "0.0.0.0"),
                   help="listen address (default: $RFT_BIND_HOST, else 0.0.0.0)")
    p.add_argument("--port", type=int, help="the port the job's clients use")
    p.add_argument("--upstream", help="vLLM's URL on loopback, e.g. http://127.0.0.1:8001")
    p.add_argument("--install-vllm-extension", metavar="DIR", default=None,
                   help="only copy the worker extension the gate calls (rft_vllm_worker.py) into DIR, which vLLM "
                        "has on its PYTHONPATH, and exit (the inference pod's init container)")
    p.add_argument("--weights-dir", default=None,
                   help="where the trainer publishes full policy versions (inference.weightSync disk): enables "
                        "/update_weights_from_disk, and the current version is loaded before /health answers")
    p.add_argument("--drain-timeout", type=float, default=120.0,
                   help="seconds an update lets the requests in flight finish before vLLM aborts them")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.install_vllm_extension:
        print(install(args.install_vllm_extension))
        return 0
    if args.port is None or args.upstream is None:
        parser.error("--port and --upstream are required")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        token = auth.server_token("rft gate")
    except auth.MissingToken as exc:
        logging.getLogger("rft.gate").error("%s", exc)
        return 2
    gate = Gate(args.upstream, weights_dir=args.weights_dir, drain_timeout_s=args.drain_timeout)
    web.run_app(create_app(gate, token), host=args.host, port=args.port, print=None,
                access_log=None, shutdown_timeout=30)
    return 0
