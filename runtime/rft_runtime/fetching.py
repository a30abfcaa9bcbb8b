"""``rft fetch --config FILE``: fetch the job's hf:// and s3:// models and datasets (the fetch Job's
command; ``rft run`` calls :func:`fetch_all` itself), then validate every dataset row once.

Exit status: 0 done (the summary is the container's termination message), 2 when retrying cannot
help (401, 403, not found, not a model, a row that does not validate: the fetch Job fails at once),
1 otherwise (the Job retries). Messages name the spec field and the URI, never a credential.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rft_api import layout, runtime
from rft_api.spec import RFTJobSpec

from .data import DatasetError
from .storage.errors import StorageError
from .storage.fetch import fetch_input

TERMINATION_LOG = Path("/dev/termination-log")
TERMINAL_EXIT = 2


class _Progress:
    """Prints the bytes downloaded so far, at most every :data:`PROGRESS_EVERY_S` seconds."""

    def __init__(self, what: str) -> None:
        self.what, self.done, self.last = what, 0, time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.last = time.monotonic()
            print(f"[fetch] {self.what}: {self.done / 1e6:.1f} MB so far", flush=True)


PROGRESS_EVERY_S = 10.0


def fetch_all(spec: RFTJobSpec, inputs_root: str, *, log: bool = True) -> list[str]:
    """Fetch every input of ``spec`` under ``inputs_root``; returns one summary line per input.
    Raises :class:`StorageError` with the spec field prefixed to its message."""
    lines = []
    for inp in layout.inputs(spec, inputs_root):
        t0 = time.monotonic()
        if log:
            print(f"[fetch] {inp.field}: {inp.uri} -> {inp.dest}", flush=True)
        try:
            manifest, fetched = fetch_input(inp, spec.storage, on_bytes=_Progress(inp.field) if log else None)
        except StorageError as e:
            raise StorageError(e.uri, e.reason, f"{inp.field}: {e.message}", e.status) from None
        mb = manifest.bytes / 1e6
        what = "fetched" if fetched else "already there"
        rev = f" @ {manifest.revision[:12]}" if manifest.revision else ""
        lines.append(f"{inp.field}: {inp.uri}{rev}: {len(manifest.files)} files, {mb:.1f} MB {what}")
        if log:
            print(f"[fetch] {lines[-1]} ({time.monotonic() - t0:.1f} s)", flush=True)
    return lines


def _validate(cfg: runtime.RuntimeConfig) -> str:
    from .trainer.datasets import load_eval_tasks, load_training_tasks

    train = load_training_tasks(cfg.spec.dataset, cfg.paths.datasets)
    ev = load_eval_tasks(cfg.spec.dataset, cfg.paths.datasets)
    return f"datasets valid: {len(train)} training tasks" + (f", {len(ev)} eval tasks" if ev else "")


def _say(text: str) -> None:
    print(text, file=sys.stderr if text.startswith("error") else sys.stdout, flush=True)
    try:
        TERMINATION_LOG.write_text(text[-4000:])
    except OSError:
        pass  # not in a pod


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rft fetch", description="fetch a job's hf:// and s3:// inputs")
    parser.add_argument("--config", required=True, help="the runtime config (JSON)")
    args = parser.parse_args(argv)
    try:
        cfg = runtime.load(args.config)
    except runtime.ConfigError as e:
        _say(f"error: {e}")
        return TERMINAL_EXIT
    root = cfg.paths.inputs or layout.inputs_dir(cfg.paths.checkpoints)
    try:
        lines = fetch_all(cfg.spec, root)
        lines.append(_validate(cfg))
    except StorageError as e:
        _say(f"error: {e} ({e.reason}{f', HTTP {e.status}' if e.status else ''})")
        return TERMINAL_EXIT if e.terminal else 1
    except DatasetError as e:
        _say(f"error: {e}")
        return TERMINAL_EXIT
    _say("; ".join(lines))
    return 0
