"""Lint the project's Dockerfiles (issue #5): hadolint, pinned base images, a non-root final USER.

hadolint's path comes from RFT_HADOLINT (`make test` sets it from hack/hadolint.sh); when unset the
test runs hack/hadolint.sh itself, so it never skips. No container engine is needed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.images.dockerfile_checks import (
    base_image_problems,
    failing,
    final_stage_user,
    format_findings,
    hadolint_findings,
    is_non_root,
)

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {"operator/Dockerfile", "runtime/Dockerfile", "images/vllm-cpu/Dockerfile"}


def _dockerfiles() -> list[Path]:
    found: set[Path] = set()
    for top in ("operator", "runtime", "images"):
        for pattern in ("Dockerfile", "Dockerfile.*", "*.Dockerfile", "*.dockerfile"):
            found.update(p for p in (REPO / top).rglob(pattern) if p.is_file())
    return sorted(found)


DOCKERFILES = _dockerfiles()
IDS = [str(p.relative_to(REPO)) for p in DOCKERFILES]


@pytest.fixture(scope="module")
def hadolint() -> str:
    """The hadolint executable: RFT_HADOLINT, or the one hack/hadolint.sh builds (or finds) now."""
    path = os.environ.get("RFT_HADOLINT", "").strip()
    if not path:
        proc = subprocess.run(
            ["bash", str(REPO / "hack" / "hadolint.sh")],
            cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"hack/hadolint.sh failed (exit {proc.returncode}):\n{proc.stderr}")
        path = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if not (path and os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"hadolint executable not found at {path!r} (RFT_HADOLINT or hack/hadolint.sh)")
    return path


@pytest.fixture(scope="module")
def hadolint_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo's .hadolint.yaml when it has one, else an empty config (no user-global settings)."""
    for name in (".hadolint.yaml", ".hadolint.yml"):
        if (REPO / name).is_file():
            return REPO / name
    empty = tmp_path_factory.mktemp("hadolint") / "hadolint.yaml"
    empty.write_text("{}\n")
    return empty


def test_expected_dockerfiles_found() -> None:
    assert EXPECTED <= set(IDS), f"expected {sorted(EXPECTED)} under operator/, runtime/ and images/, found {IDS}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_hadolint_clean(dockerfile: Path, hadolint: str, hadolint_config: Path) -> None:
    findings = hadolint_findings(hadolint, dockerfile, hadolint_config, REPO)
    bad = failing(findings)
    assert not bad, f"hadolint findings (warning/error) in {dockerfile.relative_to(REPO)}:\n" + (
        format_findings(bad)
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_base_images_pinned(dockerfile: Path) -> None:
    problems = base_image_problems(dockerfile.read_text())
    assert not problems, f"{dockerfile.relative_to(REPO)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_final_stage_runs_as_non_root(dockerfile: Path) -> None:
    user = final_stage_user(dockerfile.read_text())
    assert is_non_root(user), (
        f"{dockerfile.relative_to(REPO)}: the final stage's USER is {user!r}; "
        "it must set a literal non-root user (name or uid other than root/0)"
    )
