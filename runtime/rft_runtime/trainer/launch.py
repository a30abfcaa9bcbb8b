"""Starting the trainer's other ranks on this machine.

A trainer pod (node ``n``) runs local rank 0 itself and starts local ranks ``1..processesPerNode-1``
as child processes (``rft trainer --config FILE --local-rank L``); ``rft run`` starts every rank
but global rank 0 here (``--node N --local-rank L``: all ``nodes × processesPerNode`` ranks on one
machine). Every rank other than 0 runs :func:`~.trainer.follow`. Children inherit this process's
environment (``JOB_COMPLETION_INDEX`` included) and ignore SIGINT/SIGTERM: rank 0 decides when the
group stops (a last checkpoint is collective) and tells them to exit; when rank 0 dies their next
collective fails and they exit with an error.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Sequence

log = logging.getLogger(__name__)


def start_ranks(config_path: str | Path, ranks: Sequence[tuple[int, int]], *, port: int | None = None,
                log_dir: str | Path | None = None, threads: int | None = None) -> list[subprocess.Popen[bytes]]:
    """Start a process for each ``(node, local rank)`` in ``ranks``; their output goes to
    ``<log_dir>/trainer-rank-<node>-<local>.log`` when ``log_dir`` is given (else to this process's)."""
    procs = []
    for node, local in ranks:
        cmd = [sys.executable, "-m", "rft_runtime.trainer.main", "--config", str(config_path),
               "--node", str(node), "--local-rank", str(local)]
        if port is not None:
            cmd += ["--rendezvous-port", str(port)]
        if threads:
            cmd += ["--threads", str(threads)]
        out: IO[bytes] | None = None
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            out = open(Path(log_dir) / f"trainer-rank-{node}-{local}.log", "ab")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None))
        if out is not None:
            out.close()
    return procs


def wait_ranks(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 60.0) -> int:
    """Wait for the rank processes (rank 0 told them to exit); kill those still running after
    ``timeout_s``. Returns the first non-zero exit status, else 0."""
    deadline = time.monotonic() + timeout_s
    rc = 0
    for p in procs:
        try:
            code = p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            log.warning("trainer rank process %d did not exit: killing it", p.pid)
            p.kill()
            code = p.wait()
        if code and not rc:
            rc = code
    return rc
