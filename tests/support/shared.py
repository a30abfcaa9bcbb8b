"""Data the tests read from ``shared/``, the directory beside the checkout (``<repo>/../shared``; CI puts
a copy there), or from ``$RFT_SHARED_DIR``. Nothing of it is copied into the repository: each file a
test uses is pinned here by its sha256, so a changed copy fails loudly instead of changing what the
tests check.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

KUEUE_CRDS_SHA256 = {
    "kueue.x-k8s.io_clusterqueues.yaml": "e0a5fc9b370c70f3d993d4f599865817338ecf94187b30b15b12ff33c579bd55",
    "kueue.x-k8s.io_localqueues.yaml": "dd10ef8d3578e7212fa52763549e7b6be0949793a5b924495fcd293330109fed",
    "kueue.x-k8s.io_resourceflavors.yaml": "0241c2dbade80718dbc771a6603b3b6f20d9f7a80a3da3f0d0ffe477c0f0283c",
    "kueue.x-k8s.io_workloadpriorityclasses.yaml": "0b755726aab05b8def9a53ee15b201eed3846bcffd1ff5528fed123f4ae03519",
    "kueue.x-k8s.io_workloads.yaml": "40102b45bb5b159c12f8090cd89f2ad3431233b0245c9cae98520f45579475ba",
}
"""Kueue's CRDs (``shared/kueue-crds/``: kubernetes-sigs/kueue ``config/components/crd/bases/`` at commit
ff69552e79ad21652c36caa97038382e55625cf7, v0.20 development line; its README says more)."""


def shared_dir() -> Path:
    """``$RFT_SHARED_DIR``, else ``shared/`` beside the checkout."""
    return Path(os.environ.get("RFT_SHARED_DIR") or ROOT.parent / "shared")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pinned_files(subdir: str, pins: dict[str, str]) -> list[Path]:
    """The files ``pins`` names in ``shared/<subdir>``, each checked against its pinned sha256.

    Skips the calling test when that directory is missing (a checkout without ``shared/`` beside it);
    fails when a pinned file is missing from it or differs from its pin."""
    where = shared_dir() / subdir
    if not where.is_dir():
        pytest.skip(f"{where} is missing: the shared data directory is expected beside the checkout "
                    f"(<repo>/../shared, as CI has it) or at $RFT_SHARED_DIR")
    missing = sorted(name for name in pins if not (where / name).is_file())
    changed = sorted(name for name in pins if name not in missing and sha256(where / name) != pins[name])
    if missing or changed:
        pytest.fail(f"{where} is not the pinned data: missing {missing}, changed {changed} "
                    f"(update the pins in tests/support/shared.py only for a deliberate upgrade)", pytrace=False)
    return [where / name for name in sorted(pins)]


def kueue_crds() -> list[Path]:
    """Kueue's CRD files from ``shared/kueue-crds/``, verified against :data:`KUEUE_CRDS_SHA256`."""
    return pinned_files("kueue-crds", KUEUE_CRDS_SHA256)
