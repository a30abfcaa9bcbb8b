"""What the control plane (:mod:`e2e.cluster`) and the node (:mod:`e2e.node`) share: the binary cache
and ``hack/``'s build scripts, the cluster's service range and client certificates signed by its CA,
log tails and config files, and processes tracked by pid file (start time, process group).

The node joins a control plane but does not import :mod:`e2e.cluster`, whose CLI (``up``) starts a
node: both import this module, and ``hack/check_cycles.py`` keeps the two from importing each other.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

SERVICE_CIDR = "10.0.0.0/24"
"""The cluster's Service IP range (``--service-cluster-ip-range`` of the API server, controller-manager
and kube-router)."""


class ClusterError(RuntimeError):
    """The control plane could not be started, reached or stopped; the message says why."""


# --------------------------------------------------------------------------------------------------
# binaries and build scripts


def cache_dir() -> Path:
    """``$RFT_CACHE`` or ``~/.cache/rft-operator``."""
    return Path(os.environ.get("RFT_CACHE") or Path.home() / ".cache" / "rft-operator")


def run_build_script(script: Path, log: Path, stream: bool) -> int:
    """Run one of ``hack/``'s build scripts, its output to ``log`` (its stderr on ours with ``stream``); its
    exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.run(
            ["bash", str(script)],
            stdout=subprocess.PIPE,
            stderr=None if stream else out,
            stdin=subprocess.DEVNULL,
            # Its own session: an interrupted caller does not kill a long build, which a later call
            # (serialised by the script's lock) then finds finished or picks up.
            start_new_session=True,
        )
    return proc.returncode


# --------------------------------------------------------------------------------------------------
# files


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log (of its last 20 kB), or why it cannot be read."""
    try:
        data = path.read_bytes()[-20000:].decode(errors="replace").splitlines()
    except OSError as e:
        return f"<no log: {e}>"
    return "\n".join(data[-lines:])


def dump(obj: dict) -> str:
    """YAML when pyyaml is importable, else JSON (which kubectl and yaml loaders read too)."""
    try:
        import yaml

        return yaml.safe_dump(obj, sort_keys=False)
    except ImportError:
        return json.dumps(obj, indent=2) + "\n"


# --------------------------------------------------------------------------------------------------
# PKI: client certificates signed by the cluster's CA


def ensure_client_cert(pki: Path, name: str, common_name: str, organization: str | None) -> None:
    """``<name>.crt``/``<name>.key`` in ``pki``: a client certificate (CN ``common_name``, O
    ``organization``) signed by the cluster's CA, unless present. With the ``cryptography`` package
    when importable, else ``openssl``."""
    if (pki / f"{name}.crt").exists() and (pki / f"{name}.key").exists():
        return
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        subj = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
        for args in (["req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                      "-subj", subj],
                     ["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial",
                      str(secrets.randbits(63)), "-out", f"{name}.crt", "-days", "3650", "-sha256"]):
            p = subprocess.run(["openssl", *args], cwd=pki, capture_output=True, text=True)
            if p.returncode != 0:
                raise ClusterError(f"openssl {' '.join(args)} failed: {p.stderr.strip()}") from None
        (pki / f"{name}.csr").unlink()
        os.chmod(pki / f"{name}.key", 0o600)
        return
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    cert = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(pki / f"{name}.key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption()))


# --------------------------------------------------------------------------------------------------
# processes: pid files with start times, process-group termination


def proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # fields after the parenthesised command name: state is [0], pgrp [2], starttime [19]
    return raw[raw.rindex(")") + 2:].split()


def proc_start_time(pid: int) -> str | None:
    st = proc_stat(pid)
    return st[19] if st else None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = proc_stat(int(entry.name))
            if st and st[2] == str(pgid) and st[0] != "Z":
                members.append(int(entry.name))
    return members


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_process_group(pid: int, start_time: str | None, timeout: float = 15.0) -> None:
    """SIGTERM the process group led by ``pid``, SIGKILL it at the deadline, wait until it is gone.

    ``start_time`` (from ``/proc/<pid>/stat``) guards against a recycled pid: a leader whose start
    time differs is not ours, and its group is left alone. Raises :class:`ClusterError` when
    processes survive SIGKILL.
    """
    if start_time is not None and proc_start_time(pid) not in (None, start_time):
        return
    if not group_members(pid):
        _reap(pid)
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not group_members(pid):
                return
            time.sleep(0.1)
    raise ClusterError(f"processes {group_members(pid)} of group {pid} survived SIGKILL")


def set_pdeathsig() -> None:
    """preexec_fn: have the kernel SIGKILL the child when the process that started it dies."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
