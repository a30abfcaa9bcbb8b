"""A real local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Every process binds 127.0.0.1 on a free port and writes its log to ``<workdir>/logs/<name>.log``;
``<workdir>/run/<name>.pid`` records its pid and start time so that ``stop`` (also from another
process: ``python -m e2e.cluster down``) kills its whole process group and checks none is left.
Binaries come from ``hack/build-control-plane.sh`` (cached in
``${RFT_CACHE:-~/.cache/rft-operator}/k8s/bin``); nothing here imitates the Kubernetes API.

Authentication uses static tokens (``--token-auth-file``): an admin in ``system:masters`` and one
token each for the controller-manager and the scheduler, whose users the RBAC bootstrap policy knows.

CLI::

    python -m e2e.cluster up [--dir .cluster] [--timeout 300]   # detached; idempotent
    python -m e2e.cluster down [--dir .cluster]
    python -m e2e.cluster status [--dir .cluster]
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import fcntl
import ipaddress
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .common import (
    SERVICE_CIDR,
    ClusterError,
    cache_dir,
    dump,
    ensure_client_cert,
    proc_start_time,
    proc_stat,
    run_build_script,
    set_pdeathsig,
    stop_process_group,
    tail,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-control-plane.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "helm")
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# kube-controller-manager's canonical controller names (1.34). No kubelet runs here, so the node
# controllers (node-lifecycle would taint nodes without heartbeats; ttl; node-ipam) are left out.
DEFAULT_CONTROLLERS = (
    "garbage-collector-controller", "deployment-controller", "replicaset-controller", "job-controller",
    "cronjob-controller", "statefulset-controller", "daemonset-controller",
    "replicationcontroller-controller", "serviceaccount-controller", "serviceaccount-token-controller",
    "namespace-controller", "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller", "endpoints-controller", "endpointslice-controller",
    "endpointslice-mirroring-controller", "disruption-controller", "pod-garbage-collector-controller",
    "resourcequota-controller", "ttl-after-finished-controller", "persistentvolume-binder-controller",
    "persistentvolume-expander-controller", "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller", "ephemeral-volume-controller", "service-cidr-controller",
    "validatingadmissionpolicy-status-controller",
)


class BuildError(ClusterError):
    """``hack/build-control-plane.sh`` failed; the message holds the tail of its output."""


# --------------------------------------------------------------------------------------------------
# binaries


def bin_dir() -> Path:
    """Where ``hack/build-control-plane.sh`` puts the control-plane binaries."""
    return cache_dir() / "k8s" / "bin"


def binaries_ready() -> bool:
    """True when a finished binary set is in :func:`bin_dir`."""
    d = bin_dir()
    return (d / ".complete").exists() and all(os.access(d / b, os.X_OK) for b in BINARIES)


def ensure_binaries(log: Path | None = None, stream: bool = False) -> Path:
    """Return the binary directory, running the build script first when the set is incomplete.

    ``stream`` shows the build's progress on stderr; otherwise its output goes to ``log`` (default
    ``<cache>/k8s/build-<pid>.log``). Raises :class:`BuildError` with the output's tail on failure.
    """
    if binaries_ready():
        return bin_dir()
    if not BUILD_SCRIPT.exists():
        raise BuildError(f"{BUILD_SCRIPT} is missing")
    log = log or cache_dir() / "k8s" / f"build-{os.getpid()}.log"
    code = run_build_script(BUILD_SCRIPT, log, stream)
    if code != 0 or not binaries_ready():
        raise BuildError(f"hack/build-control-plane.sh failed (exit {code}); log {log}:\n{tail(log, 40)}")
    return bin_dir()


# --------------------------------------------------------------------------------------------------
# small helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _load(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        import yaml

        return yaml.safe_load(text)


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, token: str, user: str,
                     namespace: str | None = None) -> Path:
    """Write a one-context kubeconfig authenticating with a bearer token (mode 0600)."""
    context: dict = {"cluster": "rft-local", "user": user}
    if namespace:
        context["namespace"] = namespace
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rft-local", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "rft-local", "context": context}],
        "current-context": "rft-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(dump(cfg))
    os.replace(path.with_suffix(".tmp"), path)
    return path


# --------------------------------------------------------------------------------------------------
# PKI: a CA, one serving certificate for every component, the service-account key pair


def _serving_names() -> tuple[list[str], list[str]]:
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
           "kubernetes.default.svc.cluster.local"]
    first_service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    return dns, ["127.0.0.1", first_service_ip]


def generate_pki(pki: Path, backend: str | None = None) -> None:
    """Create ``ca.crt/key``, ``serving.crt/key`` and ``sa.key/pub`` in ``pki`` unless present.

    ``backend`` is ``"cryptography"`` or ``"openssl"``; by default the ``cryptography`` package when
    importable, else the ``openssl`` command.
    """
    files = ("ca.crt", "ca.key", "serving.crt", "serving.key", "sa.key", "sa.pub")
    if all((pki / f).exists() for f in files):
        return
    pki.mkdir(parents=True, exist_ok=True)
    if backend is None:
        try:
            import cryptography  # noqa: F401

            backend = "cryptography"
        except ImportError:
            backend = "openssl"
    if backend == "cryptography":
        _pki_cryptography(pki)
    elif backend == "openssl":
        _pki_openssl(pki)
    else:
        raise ValueError(f"backend: unknown PKI backend {backend!r} (cryptography | openssl)")
    for f in ("ca.key", "serving.key", "sa.key"):
        os.chmod(pki / f, 0o600)


def _pki_cryptography(pki: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def key() -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def save_key(k: rsa.RSAPrivateKey, name: str) -> None:
        (pki / name).write_bytes(k.private_bytes(serialization.Encoding.PEM,
                                                 serialization.PrivateFormat.TraditionalOpenSSL,
                                                 serialization.NoEncryption()))

    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=3650)
    ca_key, srv_key, sa_key = key(), key(), key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rft-local-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    dns, ips = _serving_names()
    sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
           .issuer_name(ca_name).public_key(srv_key.public_key())
           .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
           .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
           .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_cert_sign=False,
                                        crl_sign=False, content_commitment=False, data_encipherment=False,
                                        key_agreement=False, encipher_only=False, decipher_only=False),
                          critical=True)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                          critical=False)
           .sign(ca_key, hashes.SHA256()))
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (pki / "serving.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    save_key(ca_key, "ca.key")
    save_key(srv_key, "serving.key")
    save_key(sa_key, "sa.key")
    (pki / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def _pki_openssl(pki: Path) -> None:
    def run(*args: str) -> None:
        p = subprocess.run(["openssl", *args], cwd=pki, capture_output=True, text=True)
        if p.returncode != 0:
            raise ClusterError(f"openssl {' '.join(args)} failed: {p.stderr.strip()}")

    dns, ips = _serving_names()
    san = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
    (pki / "serving.ext").write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "3650", "-subj", "/CN=rft-local-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,digitalSignature,keyCertSign,cRLSign")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "serving.key", "-out", "serving.csr",
        "-subj", "/CN=kube-apiserver")
    run("x509", "-req", "-in", "serving.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial",
        str(secrets.randbits(63)), "-out", "serving.crt", "-days", "3650", "-sha256",
        "-extfile", "serving.ext")
    run("genrsa", "-out", "sa.key", "2048")
    run("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    for f in ("serving.csr", "serving.ext"):
        (pki / f).unlink()


# --------------------------------------------------------------------------------------------------
# processes: the components, each recorded in a pid file with its start time


@dataclass
class _Proc:
    name: str
    pid: int
    start_time: str | None
    popen: subprocess.Popen | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        st = proc_stat(self.pid)
        return bool(st) and st[0] != "Z" and (self.start_time is None or st[19] == self.start_time)

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None


# --------------------------------------------------------------------------------------------------
# the cluster


@dataclass
class LocalCluster:
    """A control plane whose state lives in ``workdir`` (PKI, etcd data, logs, pid files, kubeconfig).

    ``start`` launches the processes detached (own sessions), so they outlive the Python process
    that started them until ``stop`` is called, possibly from another process on the same workdir.
    ``die_with_parent=True`` (test fixtures) makes the kernel kill them if that process dies
    without calling ``stop``.
    """

    workdir: Path
    controllers: tuple[str, ...] = DEFAULT_CONTROLLERS
    bin: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    die_with_parent: bool = False
    _procs: dict[str, _Proc] = field(default_factory=dict, repr=False)
    _external: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        state = self.workdir / "cluster.json"
        if not self.ports and state.exists():
            self.ports = json.loads(state.read_text()).get("ports", {})

    # ---- paths and credentials ----------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``system:masters``)."""
        if self._external is not None:
            return Path(self._external["kubeconfig"])
        return self.workdir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def server(self) -> str:
        """``https://127.0.0.1:<port>`` of the API server."""
        if self._external is not None:
            return self._external["server"]
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def ca_pem(self) -> bytes:
        if self._external is not None:
            return self._external["ca_pem"]
        return (self.pki / "ca.crt").read_bytes()

    @property
    def admin_token(self) -> str:
        """The static admin bearer token."""
        if self._external is not None:
            return self._external["token"]
        return self._tokens()["admin"]

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def _pid_path(self, component: str) -> Path:
        return self.workdir / "run" / f"{component}.pid"

    def _tokens(self) -> dict[str, str]:
        path = self.workdir / "tokens.json"
        if not path.exists():
            toks = {k: secrets.token_urlsafe(32) for k in ("admin", "controller-manager", "scheduler")}
            path.write_text(json.dumps(toks))
            os.chmod(path, 0o600)
        return json.loads(path.read_text())

    def binary(self, name: str) -> str:
        """Path of a control-plane binary (``kubectl``, ``helm``, ...)."""
        return str((self.bin or bin_dir()) / name)

    # ---- attaching to a running cluster -------------------------------------------------------

    @classmethod
    def attach(cls, kubeconfig: Path) -> LocalCluster:
        """A handle on a running cluster from its admin kubeconfig (``stop`` is then a no-op
        unless the kubeconfig sits in a workdir written by ``start``)."""
        kubeconfig = Path(kubeconfig).resolve()
        if not kubeconfig.exists():
            raise ClusterError(f"kubeconfig {kubeconfig} does not exist")
        if (kubeconfig.parent / "cluster.json").exists() and kubeconfig.name == "kubeconfig":
            c = cls(kubeconfig.parent)
            c._adopt_running()
            return c
        cfg = _load(kubeconfig.read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cl = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        if "token" not in user or "certificate-authority-data" not in cl:
            raise ClusterError(f"{kubeconfig}: need a token user and certificate-authority-data")
        c = cls(kubeconfig.parent)  # nothing is written there: an attached cluster is read-only
        c._external = {"kubeconfig": str(kubeconfig), "server": cl["server"], "token": user["token"],
                       "ca_pem": base64.b64decode(cl["certificate-authority-data"])}
        return c

    def _adopt_running(self) -> None:
        """Track components recorded in pid files that this handle did not start."""
        for name in COMPONENTS:
            if name not in self._procs:
                rec = self._read_pid(name)
                if rec is not None:
                    self._procs[name] = _Proc(name, rec[0], rec[1])

    def _read_pid(self, name: str) -> tuple[int, str | None] | None:
        try:
            parts = self._pid_path(name).read_text().split()
        except OSError:
            return None
        return int(parts[0]), (parts[1] if len(parts) > 1 else None)

    # ---- HTTP ---------------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def get(self, path: str, port: int | None = None, token: str | None = None,
            timeout: float = 5.0) -> tuple[int, str]:
        """GET ``path`` from the API server (or another component's ``port``) as admin."""
        url = f"https://127.0.0.1:{port}{path}" if port else self.server + path
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token or self.admin_token}"})
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def ready(self) -> bool:
        """``/readyz`` answers ok (False on any connection error)."""
        try:
            return self.get("/readyz", timeout=3.0) == (200, "ok")
        except OSError:
            return False

    # ---- lifecycle ----------------------------------------------------------------------------

    def running(self) -> bool:
        """Every component's recorded process is alive and the API server is ready."""
        self._adopt_running()
        return all(n in self._procs and self._procs[n].alive() for n in COMPONENTS) and self.ready()

    def start(self, timeout: float = 300.0) -> LocalCluster:
        """Start the control plane and return once ``/readyz`` is ok, the controller-manager and the
        scheduler answer ``/healthz``, and ``default/default`` ServiceAccount exists.

        Raises :class:`ClusterError` (with the failing component's log tail) when a process exits
        or a deadline passes; everything started is stopped again first.
        """
        if self._external is not None:
            raise ClusterError("an attached cluster cannot be started")
        self.bin = self.bin or ensure_binaries()
        if self.running():
            return self
        self.stop()
        for attempt in range(3):
            try:
                self._start_once(timeout)
                return self
            except ClusterError as e:
                self.stop()
                if "address already in use" not in str(e) or attempt == 2:
                    raise
                self.ports = {}

        raise AssertionError("unreachable")

    def _choose_ports(self) -> None:
        names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
        if not all(self.ports.get(n) and _port_free(self.ports[n]) for n in names):
            self.ports = {n: free_port() for n in names}
        (self.workdir / "cluster.json").write_text(json.dumps({"ports": self.ports}, indent=2))

    def _start_once(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for d in ("logs", "run", "etcd"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir / "etcd", 0o700)
        generate_pki(self.pki)
        # The API server's identity towards kubelets (logs, exec), in system:masters.
        ensure_client_cert(self.pki, "kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
        self._choose_ports()
        self._write_credentials()

        self._launch("etcd", self._etcd_args())
        self._wait("etcd /health", deadline, ["etcd"], self._etcd_healthy)
        self._launch("kube-apiserver", self._apiserver_args())
        self._wait("kube-apiserver /readyz", deadline, ["etcd", "kube-apiserver"], self.ready)
        self._launch("kube-controller-manager", self._controller_manager_args())
        self._launch("kube-scheduler", self._scheduler_args())
        for comp in ("kube-controller-manager", "kube-scheduler"):
            port = self.ports[comp]
            self._wait(f"{comp} /healthz", deadline, list(COMPONENTS),
                       lambda p=port: self.get("/healthz", port=p, timeout=3.0) == (200, "ok"))
        self._wait("namespace default and ServiceAccount default/default", deadline, list(COMPONENTS),
                   lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200)

    def _write_credentials(self) -> None:
        toks = self._tokens()
        lines = [f'{toks["admin"]},rft-admin,rft-admin,"system:masters"',
                 f'{toks["controller-manager"]},system:kube-controller-manager,system:kube-controller-manager',
                 f'{toks["scheduler"]},system:kube-scheduler,system:kube-scheduler']
        path = self.pki / "tokens.csv"
        path.write_text("\n".join(lines) + "\n")
        os.chmod(path, 0o600)
        ca = self.ca_pem
        write_kubeconfig(self.kubeconfig, self.server, ca, toks["admin"], "rft-admin")
        write_kubeconfig(self.workdir / "controller-manager.kubeconfig", self.server, ca,
                         toks["controller-manager"], "system:kube-controller-manager")
        write_kubeconfig(self.workdir / "scheduler.kubeconfig", self.server, ca,
                         toks["scheduler"], "system:kube-scheduler")

    def _etcd_args(self) -> list[str]:
        p, peer = self.ports["etcd"], self.ports["etcd-peer"]
        return [
            "--name=rft", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p}", f"--advertise-client-urls=http://127.0.0.1:{p}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=rft=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level=warn", "--logger=zap",
        ]

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['etcd']}/health", timeout=3) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['kube-apiserver']}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'serving.crt'}", f"--tls-private-key-file={pki / 'serving.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The default lease reconciler would publish 127.0.0.1 as the `kubernetes` Service's
            # endpoint, which endpoint validation rejects (loopback), logging errors forever.
            "--endpoint-reconciler-type=none",
            # Fills extension-apiserver-authentication's requestheader bundle, which the
            # controller-manager and scheduler otherwise report missing in a loop. No certificate
            # with the allowed name is ever issued.
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true", "--profiling=false",
        ]

    def _controller_manager_args(self) -> list[str]:
        pki = self.pki
        return [
            f"--kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kube-controller-manager']}",
            f"--tls-cert-file={pki / 'serving.crt'}", f"--tls-private-key-file={pki / 'serving.key'}",
            f"--controllers={','.join(self.controllers)}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false", "--profiling=false",
        ]

    def _scheduler_args(self) -> list[str]:
        pki = self.pki
        kc = self.workdir / "scheduler.kubeconfig"
        return [
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kube-scheduler']}",
            f"--tls-cert-file={pki / 'serving.crt'}", f"--tls-private-key-file={pki / 'serving.key'}",
            "--leader-elect=false", "--profiling=false",
            # A pod found unschedulable (e.g. its claim not bound yet) is retried after 10 s at the
            # latest, not 5 minutes: claims here are provisioned a moment after the pod is created.
            "--pod-max-in-unschedulable-pods-duration=10s",
        ]

    def _launch(self, name: str, args: list[str]) -> None:
        exe = self.binary(name)
        log = open(self.log_path(name), "ab")
        try:
            log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {exe} {' '.join(args)}\n".encode())
            log.flush()
            popen = subprocess.Popen([exe, *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     cwd=self.workdir, start_new_session=True,
                                     preexec_fn=set_pdeathsig if self.die_with_parent else None)
        finally:
            log.close()
        proc = _Proc(name, popen.pid, proc_start_time(popen.pid), popen)
        self._procs[name] = proc
        self._pid_path(name).write_text(f"{proc.pid} {proc.start_time or ''}\n")

    def _wait(self, what: str, deadline: float, watch: Iterable[str], ok: Callable[[], bool]) -> None:
        while True:
            for name in watch:
                proc = self._procs[name]
                if not proc.alive():
                    raise ClusterError(f"{name} exited (code {proc.exit_code()}) while waiting for {what}; "
                                       f"log {self.log_path(name)}:\n{tail(self.log_path(name))}")
            try:
                if ok():
                    return
                last = "not ready yet"
            except OSError as e:  # connection refused, TLS or HTTP errors while it comes up
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n} ({self.log_path(n)}):\n{tail(self.log_path(n), 12)}"
                                  for n in watch)
                raise ClusterError(f"timed out waiting for {what} (last check: {last})\n{tails}")
            time.sleep(0.5)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every component (also ones started by another process on this workdir) and verify
        that none of their processes is left. A no-op on an attached external cluster."""
        if self._external is not None:
            return
        self._adopt_running()
        for name in reversed(COMPONENTS):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            stop_process_group(proc.pid, proc.start_time, timeout)
            if proc.popen is not None:
                proc.popen.wait(timeout=5)
            self._pid_path(name).unlink(missing_ok=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- clients ------------------------------------------------------------------------------

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """``os.environ`` with ``KUBECONFIG`` set and the binary directory first on ``PATH``."""
        return {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig),
                "PATH": f"{self.bin or bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}"}

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; ``check`` raises :class:`ClusterError` with stderr."""
        cmd = [self.binary("kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout,
                           env=self.env(kubeconfig))
        if check and p.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
        return p

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path,
                                   duration_s: int = 3600) -> Path:
        """Write a kubeconfig authenticating as ServiceAccount ``namespace/name`` with a token from
        the TokenRequest API (``kubectl create token``), so a process gets exactly its RBAC."""
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration_s}s").stdout.strip()
        if not token:
            raise ClusterError(f"TokenRequest for serviceaccount {namespace}/{name} returned no token")
        return write_kubeconfig(Path(path), self.server, self.ca_pem, token,
                                f"system:serviceaccount:{namespace}:{name}", namespace=namespace)


# --------------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    """``up`` / ``down`` / ``status`` for a cluster in ``--dir`` (default ``.cluster``)."""
    ap = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("up", "down", "status"))
    ap.add_argument("--dir", default=".cluster", type=Path, help="state directory (default .cluster)")
    ap.add_argument("--timeout", default=300.0, type=float, help="seconds to wait for readiness (up)")
    ap.add_argument("--node", action=argparse.BooleanOptionalAction, default=True,
                    help="also start a real node (kubelet, containerd, kube-proxy, CoreDNS; e2e/node.py)")
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(a.dir)
    lock = open(a.dir / ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent `up`/`down` on one directory take turns
    try:
        if a.command == "up":
            if not binaries_ready():
                print("[cluster] building control-plane binaries (one time)", file=sys.stderr)
            cluster.bin = ensure_binaries(stream=True)
            already = cluster.running()
            cluster.start(timeout=a.timeout)
            print(f"[cluster] {'already up' if already else 'up'}: {cluster.server}", file=sys.stderr)
            if a.node:
                from .node import LocalNode, ensure_node_binaries
                node = LocalNode(cluster, bin=ensure_node_binaries(stream=True))
                node.start(timeout=a.timeout)
                print(f"[cluster] node {node.name} Ready ({node.net.node_ip}, netns {node.net.netns})",
                      file=sys.stderr)
            print(f"export KUBECONFIG={cluster.kubeconfig}")
        elif a.command == "down":
            if (a.dir / "node").exists():
                from .node import LocalNode
                LocalNode(cluster).stop(delete_node=False)
            cluster.stop()
            print(f"[cluster] stopped ({cluster.workdir})", file=sys.stderr)
        else:
            up = cluster.running()
            print(f"{'up' if up else 'down'} {cluster.server if cluster.ports else ''}".strip())
            return 0 if up else 1
    except (ClusterError, RuntimeError) as e:
        print(f"[cluster] error: {e}", file=sys.stderr)
        return 1
    finally:
        lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
