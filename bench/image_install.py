"""Installing an image's locked dependency set: pip (what the Dockerfiles ran) against uv (what they run now).

Each installer installs the same lock file (hashes checked, no dependency resolution, byte-compiled as pip
does by default) into a new venv of this machine's Python, downloading every wheel from the index (no
cache on either side), as an image build does. Rounds alternate (pip, uv, uv, pip, ...); medians reported.
The wall time and the CPU time of the installer and its children are both recorded: on a 2-core CI machine
the image builds run beside the Go builds and the tests, so CPU seconds are what an install costs the run.

`ratios.uv_over_pip_wall` and `ratios.uv_over_pip_cpu` (lower is better; both installs hold the same files,
the same number of them byte-compiled).

    .venv/bin/python bench/image_install.py [--quick] [--lock requirements/runtime.txt] [--rounds 1]

``--quick`` installs requirements/uv.txt (one wheel), for the smoke test.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report

ROOT = Path(__file__).resolve().parents[1]


def _uv() -> str:
    return subprocess.run(["bash", str(ROOT / "hack" / "uv.sh")], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def install(installer: str, lock: Path, uv: str, work: Path) -> dict:
    """One install of ``lock`` into a new venv under ``work``: wall and CPU seconds, files installed."""
    venv = work / f"venv-{installer}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    if installer == "pip":
        cmd = [str(py), "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-deps", "--require-hashes",
               "-r", str(lock)]
    else:
        cmd = [uv, "pip", "install", "--quiet", "--python", str(py), "--no-cache", "--no-deps", "--require-hashes",
               "--compile-bytecode", "-r", str(lock)]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{installer} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    site = next(venv.glob("lib/python*/site-packages"))
    files = sum(1 for p in site.rglob("*") if p.is_file())
    pyc = sum(1 for _ in site.rglob("*.pyc"))
    size_mb = sum(p.stat().st_size for p in site.rglob("*") if p.is_file()) / 2**20
    shutil.rmtree(venv)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "files": files, "pyc_files": pyc,
            "size_mb": round(size_mb, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="install requirements/uv.txt only (smoke test)")
    ap.add_argument("--lock", type=Path, default=ROOT / "requirements" / "runtime.txt")
    ap.add_argument("--rounds", type=int, default=1, help="pairs of installs (pip, uv), alternating order")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "image_install.json")
    args = ap.parse_args()
    lock = ROOT / "requirements" / "uv.txt" if args.quick else args.lock
    report: dict = {"benchmark": "image_install", "quick": args.quick, "started": _report.started(),
                    "machine": _report.machine(), "lock": str(lock.relative_to(ROOT))}
    uv = _uv()
    runs: dict[str, list[dict]] = {"pip": [], "uv": []}
    with tempfile.TemporaryDirectory(prefix="rft-image-install-") as tmp:
        for r in range(args.rounds):
            for installer in (("pip", "uv") if r % 2 == 0 else ("uv", "pip")):
                runs[installer].append(install(installer, lock, uv, Path(tmp)))
                print(f"{installer}: {runs[installer][-1]}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("wall_s", "cpu_s")} | {
        "files": v[0]["files"], "pyc_files": v[0]["pyc_files"], "size_mb": v[0]["size_mb"]}
        for k, v in runs.items()}
    report["installers"] = med
    report["runs"] = runs
    report["ratios"] = {"uv_over_pip_wall": round(med["uv"]["wall_s"] / med["pip"]["wall_s"], 3),
                        "uv_over_pip_cpu": round(med["uv"]["cpu_s"] / med["pip"]["cpu_s"], 3)}
    _report.write(args.out, report)


if __name__ == "__main__":
    main()
