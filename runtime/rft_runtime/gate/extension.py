"""Installing the gate's vLLM worker extension (:mod:`.vllm_worker`) where vLLM imports it."""

from __future__ import annotations

import shutil
from pathlib import Path

MODULE = "rft_vllm_worker"
WORKER_EXTENSION_CLS = f"{MODULE}.RFTWorkerExtension"
"""vLLM's ``--worker-extension-cls`` for the gate's reload method."""
RELOAD_METHOD = "rft_reload_weights"
"""The worker method the gate calls through ``/collective_rpc``."""


def install(directory: str | Path) -> Path:
    """Copy the extension into ``directory`` (to be on vLLM's ``PYTHONPATH``) as ``rft_vllm_worker.py``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{MODULE}.py"
    shutil.copyfile(Path(__file__).with_name("vllm_worker.py"), target)
    return target
