"""A real Kubernetes node on this machine: containerd + runc + CNI, kubelet, kube-proxy, CoreDNS, and
kube-router enforcing NetworkPolicies.

The node lives in its own network namespace (``rftn-<id>``, like a kind node container): a veth pair
links it to the host (``10.213.<slot>.1`` host side, ``10.213.<slot>.2`` the node's InternalIP), the
pod bridge ``rftnbr0`` is inside it, pods get ``10.214.<slot>.0/24`` addresses. Nothing is routed
off the machine: the host keeps ``ip_forward`` as it is and drops anything forwarded from or to the
node's veth. The API server keeps listening on 127.0.0.1; the host DNATs ``10.213.<slot>.1:<port>``
to it (``route_localnet`` on the host veth only), which is also the ``kubernetes`` Service's endpoint.

Processes (each its own session, pid file in ``<workdir>/run``): containerd (``nsenter --net``: its
CNI calls create the bridge in the node's namespace; its shims stay in the node's cgroup), kubelet
(cgroupfs driver under ``<our memory cgroup>/rftn-<id>``), kube-proxy (iptables mode, inside the
namespace), kube-router (its NetworkPolicy controller only, inside the namespace: iptables chains
and ipsets, both per network namespace; no routing, no service proxy), and the local-directory PV
provisioner (``python -m e2e.provisioner``). Cluster DNS is
CoreDNS as a Deployment in ``kube-system`` behind Service ``kube-dns`` (``10.0.0.10``), from an image
built FROM scratch by ``hack/build-node.sh``, like the pause image; both are imported into the
node's containerd with ``ctr images import``. Dynamic provisioning: StorageClass ``local`` (default)
backed by directories under ``<workdir>/pv`` (ReadWriteOnce and ReadWriteMany: one node).

NetworkPolicies are enforced as on a cluster with a policy-enforcing network plugin: a pod's
connections to a pod that a policy selects pass only where a rule admits them, except from the node
itself (kube-router accepts what the node sends, as kubelet probes need). So a test that talks to a
pod from this machine does it from inside the node's namespace (:meth:`LocalNode.request`).

Credentials: the kubelet, kube-proxy and kube-router authenticate with client certificates signed by
the cluster's CA (``system:node:<name>`` / ``system:nodes``, ``system:kube-proxy``,
``system:kube-router``, the last bound to a ClusterRole that reads pods, namespaces, nodes and
NetworkPolicies); the API server
reaches the kubelet with its ``kubelet-client`` certificate (``system:masters``), which the kubelet
authenticates against the CA and authorises by SubjectAccessReview.

``stop`` (also from another process: ``python -m e2e.cluster down``) stops the kubelet, kills every
process in the node's cgroups (pods, shims, containerd), unmounts everything under the workdir,
deletes the namespace (and with it the veth, bridge and kube-proxy's rules), the host's iptables
rules and the cgroups, and checks nothing is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .common import (
    SERVICE_CIDR,
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
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-node.sh"
NODE_BINARIES = ("kubelet", "kube-proxy", "coredns", "kube-router", "pause", "pause.oci", "coredns.oci")
DNS_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
COMPONENTS = ("containerd", "kubelet", "kube-proxy", "kube-router", "provisioner")
KUBE_ROUTER_CHAIN = "KUBE-ROUTER-FORWARD"  # exists in the node's namespace once kube-router has synced
STORAGE_CLASS = "local"
PROVISIONER_NAME = "rft.dev/local-dir"


class ControlPlane(Protocol):
    """What a node needs of the control plane it joins: :class:`e2e.cluster.LocalCluster` is one. (This
    module does not import :mod:`e2e.cluster`, whose ``up`` starts a node.)"""

    workdir: Path

    @property
    def server(self) -> str: ...

    @property
    def pki(self) -> Path: ...

    @property
    def ca_pem(self) -> bytes: ...

    @property
    def kubeconfig(self) -> Path: ...

    def ready(self) -> bool: ...

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]: ...


class NodeError(RuntimeError):
    """The node could not be built, started or stopped; the message says why."""


def node_bin_dir() -> Path:
    return cache_dir() / "node" / "bin"


def node_binaries_ready() -> bool:
    d = node_bin_dir()
    return (d / ".complete").exists() and all((d / b).exists() for b in NODE_BINARIES) \
        and shutil.which("containerd") is not None and shutil.which("runc") is not None


def ensure_node_binaries(stream: bool = False) -> Path:
    """The node's binary directory, running ``hack/build-node.sh`` first when incomplete."""
    if node_binaries_ready():
        return node_bin_dir()
    log = cache_dir() / "node" / f"build-{os.getpid()}.log"
    code = run_build_script(BUILD_SCRIPT, log, stream)
    if code != 0 or not node_binaries_ready():
        raise NodeError(f"hack/build-node.sh failed (exit {code}); log {log}:\n{tail(log, 40)}")
    return node_bin_dir()


def images_of(bin_dir: Path) -> dict[str, str]:
    """``{"pause": ref, "coredns": ref}`` as hack/build-node.sh named them."""
    out = {}
    for line in (bin_dir / "IMAGES").read_text().splitlines():
        k, v = line.split()
        out[k] = v
    return out


def _run(*cmd: str, check: bool = True, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, input=input, timeout=timeout)
    if check and p.returncode != 0:
        raise NodeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p


# ------------------------------------------------------------------------------------------ network


@dataclass
class NodeNetwork:
    """Names and addresses of one node's network (pure values; ``create``/``delete`` do the work)."""

    ident: str
    slot: int

    @property
    def netns(self) -> str:
        return f"rftn-{self.ident}"

    @property
    def host_veth(self) -> str:
        return f"rftn{self.ident}h"

    @property
    def chain(self) -> str:
        return f"RFTN-{self.ident.upper()}"

    @property
    def host_ip(self) -> str:
        return f"10.213.{self.slot}.1"

    @property
    def node_ip(self) -> str:
        return f"10.213.{self.slot}.2"

    @property
    def pod_cidr(self) -> str:
        return f"10.214.{self.slot}.0/24"

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def nsenter(self) -> list[str]:
        return ["nsenter", f"--net={self.netns_path}", "--"]

    @classmethod
    def choose(cls, ident: str) -> NodeNetwork:
        """A slot whose addresses no interface of this machine has."""
        used = _run("ip", "-4", "-o", "addr", "show").stdout + _run("ip", "-4", "route", "show").stdout
        start = int(ident, 16) % 200
        for i in range(200):
            slot = (start + i) % 200 + 20
            if f"10.213.{slot}." not in used and f"10.214.{slot}." not in used:
                return cls(ident, slot)
        raise NodeError("no free 10.213.x.0/30 slot for the node's veth")

    def exists(self) -> bool:
        return Path(self.netns_path).exists()

    def create(self, api_port: int) -> None:
        self.delete()
        ns = self.nsenter()
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_veth)
        _run("ip", "link", "set", self.host_veth, "up")
        _run(*ns, "ip", "addr", "add", f"{self.node_ip}/30", "dev", "eth0")
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run(*ns, "ip", "link", "set", "eth0", "up")
        _run(*ns, "ip", "route", "add", "default", "via", self.host_ip)
        _run("ip", "route", "add", self.pod_cidr, "via", self.node_ip, "dev", self.host_veth)
        for key, value in (("net.ipv4.ip_forward", "1"), ("net.bridge.bridge-nf-call-iptables", "1")):
            _run(*ns, "sysctl", "-qw", f"{key}={value}", check=False)
        _run("sysctl", "-qw", f"net.ipv4.conf.{self.host_veth}.route_localnet=1")
        # Host side: the API server (127.0.0.1) is reachable as host_ip:port; the node's traffic may
        # reach nothing else on the host, and nothing is forwarded between it and other interfaces.
        c = self.chain
        _run("iptables", "-t", "nat", "-N", c)
        _run("iptables", "-t", "nat", "-A", c, "-p", "tcp", "-d", self.host_ip, "--dport", str(api_port),
             "-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}")
        _run("iptables", "-t", "nat", "-I", "PREROUTING", "-i", self.host_veth, "-j", c)
        _run("iptables", "-N", c)
        _run("iptables", "-A", c, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        _run("iptables", "-A", c, "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT")
        _run("iptables", "-A", c, "-j", "DROP")
        _run("iptables", "-I", "INPUT", "-i", self.host_veth, "-j", c)
        _run("iptables", "-I", "FORWARD", "-i", self.host_veth, "-j", "DROP")
        _run("iptables", "-I", "FORWARD", "-o", self.host_veth, "-j", "DROP")

    def admit_host_port(self, port: int) -> None:
        """Let the node reach a server of this machine bound to ``host_ip:port`` (TCP): a test's registry.
        The rule lives in this node's chain and goes with it."""
        rule = ["-p", "tcp", "-d", self.host_ip, "--dport", str(port), "-j", "ACCEPT"]
        if _run("iptables", "-C", self.chain, *rule, check=False).returncode != 0:
            _run("iptables", "-I", self.chain, "1", *rule)

    def delete(self) -> None:
        """Remove the namespace (its interfaces, bridge and rules go with it) and the host's rules."""
        if self.exists():
            _run("ip", "netns", "del", self.netns, check=False)
        if Path(f"/sys/class/net/{self.host_veth}").exists():
            _run("ip", "link", "del", self.host_veth, check=False)
        c = self.chain
        for table, parent, args in (("nat", "PREROUTING", ["-i", self.host_veth, "-j", c]),
                                    ("filter", "INPUT", ["-i", self.host_veth, "-j", c]),
                                    ("filter", "FORWARD", ["-i", self.host_veth, "-j", "DROP"]),
                                    ("filter", "FORWARD", ["-o", self.host_veth, "-j", "DROP"])):
            while _run("iptables", "-t", table, "-D", parent, *args, check=False).returncode == 0:
                pass
        for table in ("nat", "filter"):
            if _run("iptables", "-t", table, "-F", c, check=False).returncode == 0:
                _run("iptables", "-t", table, "-X", c, check=False)

    def leftovers(self) -> list[str]:
        out = []
        if self.exists():
            out.append(f"netns {self.netns}")
        if Path(f"/sys/class/net/{self.host_veth}").exists():
            out.append(f"interface {self.host_veth}")
        for table in ("nat", "filter"):
            rules = _run("iptables", "-t", table, "-S", check=False).stdout
            if self.chain in rules or self.host_veth in rules:
                out.append(f"iptables {table} rules naming {self.chain}/{self.host_veth}")
        return out


# ------------------------------------------------------------------------------------------ cgroups


def _own_cgroup(controller: str = "memory") -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path
    return "/"


def _v1_controllers(with_unified: bool = False) -> list[Path]:
    root = Path("/sys/fs/cgroup")
    return [p for p in sorted(root.iterdir())
            if (with_unified or p.name != "unified") and (p / "cgroup.procs").exists()]


class NodeCgroups:
    """The cgroup (every v1 hierarchy) under which the kubelet puts pods and containerd its shims."""

    def __init__(self, ident: str) -> None:
        parent = _own_cgroup("memory")
        self.root = f"{parent.rstrip('/')}/rftn-{ident}"

    def create(self) -> None:
        for ctl in _v1_controllers():
            d = ctl / self.root.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            if ctl.name == "cpuset":  # a v1 cpuset child needs cpus and mems before it takes tasks
                p = ctl
                for part in Path(self.root.lstrip("/")).parts:
                    c = p / part
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        if not (c / f).read_text().strip():
                            (c / f).write_text((p / f).read_text())
                    p = c
        (self._dir("pids") / "runtime").mkdir(exist_ok=True)

    def _dir(self, ctl: str) -> Path:
        return Path("/sys/fs/cgroup") / ctl / self.root.lstrip("/")

    def runtime_procs_file(self) -> Path:
        return self._dir("pids") / "runtime" / "cgroup.procs"

    def pids(self) -> list[int]:
        """Every process in the node's cgroups (pods, shims, containerd)."""
        out: set[int] = set()
        base = self._dir("pids")
        if base.exists():
            for procs in base.rglob("cgroup.procs"):
                try:
                    out.update(int(x) for x in procs.read_text().split())
                except OSError:
                    pass
        return sorted(out)

    def kill_all(self, timeout: float = 10.0) -> None:
        for sig, wait in ((signal.SIGKILL, timeout),):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.1)
        if self.pids():
            raise NodeError(f"processes {self.pids()} of the node's cgroup survived SIGKILL")

    def delete(self) -> None:
        for ctl in _v1_controllers(with_unified=True):
            d = ctl / self.root.lstrip("/")
            if not d.exists():
                continue
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                try:
                    sub.rmdir()
                except OSError:
                    pass
            try:
                d.rmdir()
            except OSError:
                pass

    def leftovers(self) -> list[str]:
        return [str(ctl / self.root.lstrip("/")) for ctl in _v1_controllers(with_unified=True) if (ctl / self.root.lstrip("/")).exists()]


def unmount_under(path: Path) -> None:
    """Unmount every mount point at or below ``path`` (deepest first, lazily when busy)."""
    prefix = str(path.resolve())
    for _ in range(5):
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                points.append(mp)
        if not points:
            return
        for mp in sorted(set(points), key=lambda m: -m.count("/")):
            if subprocess.run(["umount", mp], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", mp], capture_output=True)


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4] == prefix or line.split()[4].startswith(prefix + "/")]


# ------------------------------------------------------------------------------------------ the node


def node_workdir(cluster_workdir: Path) -> Path:
    """``<cluster workdir>/node``: where the node of the control plane in ``cluster_workdir`` keeps its state."""
    return (Path(cluster_workdir) / "node").resolve()


def _containerd_socket(workdir: Path) -> Path:
    return workdir / "containerd" / "containerd.sock"


def import_archive(workdir: Path, archive: Path, timeout: float = 900) -> None:
    """``ctr -n k8s.io images import`` of an oci-archive into the containerd of the node whose state is in
    ``workdir``, unless that node already imported that archive (its name carries the input hash)."""
    done = workdir / "imported.txt"
    seen = done.read_text().split() if done.exists() else []
    if str(archive) in seen:
        return
    _run("ctr", f"--address={_containerd_socket(workdir)}", "-n", "k8s.io", "images", "import", str(archive),
         timeout=timeout)
    with open(done, "a") as f:
        f.write(f"{archive}\n")


@dataclass
class LocalNode:
    """One node registered with ``cluster``; its state lives in ``<cluster workdir>/node``."""

    cluster: ControlPlane
    name: str = "rft-node"
    die_with_parent: bool = False
    bin: Path | None = None
    _net: NodeNetwork | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.workdir = node_workdir(self.cluster.workdir)
        self.ident = hashlib.sha1(str(self.workdir).encode()).hexdigest()[:6]
        self.cgroups = NodeCgroups(self.ident)
        state = self.workdir / "node.json"
        if state.exists():
            s = json.loads(state.read_text())
            self._net = NodeNetwork(s["ident"], s["slot"])
            self.name = s.get("name", self.name)

    # ---- paths ---------------------------------------------------------------------------------

    @property
    def net(self) -> NodeNetwork:
        if self._net is None:
            raise NodeError("the node has no network yet (start it first)")
        return self._net

    @property
    def socket(self) -> Path:
        return _containerd_socket(self.workdir)

    @property
    def pv_root(self) -> Path:
        return self.workdir / "pv"

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def _pid_path(self, name: str) -> Path:
        return self.workdir / "run" / f"{name}.pid"

    def binary(self, name: str) -> str:
        return str((self.bin or node_bin_dir()) / name)

    # ---- lifecycle -----------------------------------------------------------------------------

    def running(self) -> bool:
        for name in COMPONENTS:
            rec = self._read_pid(name)
            if rec is None:
                return False
            st = proc_stat(rec[0])
            if not st or st[0] == "Z" or (rec[1] and st[19] != rec[1]):
                return False
        return self._net is not None and self._net.exists()

    def start(self, timeout: float = 300.0) -> LocalNode:
        """Start the node and return once it is Ready and CoreDNS answers (see the module docstring)."""
        if os.geteuid() != 0:
            raise NodeError("a local node needs root (network namespaces, mounts, cgroups)")
        self.bin = self.bin or ensure_node_binaries()
        if self.running() and self.ready():
            return self
        self.stop()
        deadline = time.monotonic() + timeout
        try:
            self._start_once(deadline)
        except BaseException:
            try:
                self.stop()
            except NodeError:
                pass
            raise
        return self

    def _start_once(self, deadline: float) -> None:
        for d in ("logs", "run", "containerd", "kubelet", "cni/net.d", "cni/ipam", "pv", "pki", "pod-logs"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        api_port = int(self.cluster.server.rsplit(":", 1)[1])
        self._net = NodeNetwork.choose(self.ident)
        (self.workdir / "node.json").write_text(json.dumps(
            {"ident": self.ident, "slot": self._net.slot, "name": self.name}))
        self.net.create(api_port)
        self.cgroups.create()
        pki = self.cluster.pki
        ensure_client_cert(pki, "node", f"system:node:{self.name}", "system:nodes")
        ensure_client_cert(pki, "kube-proxy", "system:kube-proxy", None)
        ensure_client_cert(pki, "kube-router", "system:kube-router", None)
        server = f"https://{self.net.host_ip}:{api_port}"
        self._kubeconfig("kubelet", server, pki / "node.crt", pki / "node.key")
        self._kubeconfig("kube-proxy", server, pki / "kube-proxy.crt", pki / "kube-proxy.key")
        self._kubeconfig("kube-router", server, pki / "kube-router.crt", pki / "kube-router.key")
        self._write_containerd_config()
        self._write_cni_config()
        self._write_kubelet_config()
        self._write_kube_proxy_config()
        self._install_seccomp_profiles()

        self._launch("containerd", [*self.net.nsenter(), "containerd", "--config",
                                    str(self.workdir / "containerd" / "config.toml")],
                     cgroup_procs=self.cgroups.runtime_procs_file())
        self._wait("containerd", deadline, ["containerd"], lambda: self._ctr("version", check=False).returncode == 0)
        imgs = images_of(Path(self.bin))
        for name in ("pause", "coredns"):
            self._ctr("images", "import", "--no-unpack" if False else "--all-platforms",
                      str(Path(self.bin) / f"{name}.oci"), timeout=120)
            listed = self._ctr("images", "ls", "-q").stdout.split()
            if imgs[name] not in listed:
                raise NodeError(f"ctr images import of {name}.oci did not name {imgs[name]} (has: {listed})")
        self._publish_apiserver_endpoint(api_port)
        self._launch("kubelet", [*self.net.nsenter(), self.binary("kubelet"),
                                 f"--config={self.workdir / 'kubelet' / 'config.yaml'}",
                                 f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
                                 f"--hostname-override={self.name}", f"--node-ip={self.net.node_ip}",
                                 f"--root-dir={self.workdir / 'kubelet'}",
                                 f"--cert-dir={self.workdir / 'kubelet' / 'pki'}", "--v=1"])
        self._launch("kube-proxy", [*self.net.nsenter(), self.binary("kube-proxy"),
                                    f"--config={self.workdir / 'kube-proxy.yaml'}", "--v=1"])
        self._launch("provisioner", [sys.executable, "-m", "e2e.provisioner",
                                     f"--kubeconfig={self.cluster.kubeconfig}", f"--root={self.pv_root}",
                                     f"--owner={self.name}-{self.ident}"], cwd=REPO_ROOT)
        watch = [c for c in COMPONENTS if c != "kube-router"]
        self._wait("node Ready", deadline, watch, self.ready)
        self._untaint()
        self._install_addons(imgs["coredns"])
        # kube-router reads its Node object when it starts: after the kubelet registered it
        self._launch("kube-router", [*self.net.nsenter(), self.binary("kube-router"),
                                     f"--kubeconfig={self.workdir / 'kube-router.kubeconfig'}",
                                     f"--hostname-override={self.name}", "--run-firewall=true",
                                     "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
                                     "--enable-pod-egress=false", "--enable-ibgp=false", "--enable-overlay=false",
                                     f"--service-cluster-ip-range={SERVICE_CIDR}", "--health-addr=127.0.0.1",
                                     "--metrics-port=0", "--v=1"])
        self._wait("kube-router's NetworkPolicy chains", deadline, list(COMPONENTS), self._policies_enforced)
        self._wait("CoreDNS Ready", deadline, list(COMPONENTS), self._dns_ready)

    # ---- configuration files -------------------------------------------------------------------

    def _kubeconfig(self, name: str, server: str, cert: Path, key: Path) -> None:
        import base64

        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "rft-local", "cluster": {
                "server": server, "tls-server-name": "localhost",
                "certificate-authority-data": base64.b64encode(self.cluster.ca_pem).decode()}}],
            "users": [{"name": name, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "rft-local", "context": {"cluster": "rft-local", "user": name}}],
            "current-context": "rft-local",
        }
        (self.workdir / f"{name}.kubeconfig").write_text(dump(cfg))

    def _write_containerd_config(self) -> None:
        d = self.workdir / "containerd"
        pause = images_of(Path(self.bin))["pause"]
        (d / "config.toml").write_text(f"""version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
disabled_plugins = ["io.containerd.grpc.v1.cri.v1alpha2", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{d / 'containerd.sock.ttrpc'}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This machine's processes lack CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below ours.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.workdir / 'cni' / 'net.d'}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d / 'certs.d'}"
""")

    def _write_cni_config(self) -> None:
        conf = {
            "cniVersion": "0.4.0", "name": "rftn",
            "plugins": [
                {"type": "bridge", "bridge": "rftnbr0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": self.net.pod_cidr}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.workdir / "cni" / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (self.workdir / "cni" / "net.d" / "10-rftn.conflist").write_text(json.dumps(conf, indent=2))

    def _write_kubelet_config(self) -> None:
        k = self.workdir / "kubelet"
        (k / "resolv.conf").write_text(f"nameserver {DNS_IP}\n")
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.net.node_ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cluster.pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroups.root, "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "clusterDNS": [DNS_IP], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": str(k / "resolv.conf"),
            "failSwapOn": False, "protectKernelDefaults": False,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            # Images cannot be pulled here: never garbage-collect them (a full disk made the kubelet
            # delete the pause image, after which no pod could start).
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99, "imageMinimumGCAge": "87600h",
            "serializeImagePulls": False, "maxPods": 110,
            "volumePluginDir": str(self.workdir / "kubelet-plugins"),
            "podLogsDir": str(self.workdir / "pod-logs"),
            "nodeStatusUpdateFrequency": "5s", "nodeStatusReportFrequency": "30s",
            "syncFrequency": "10s", "fileCheckFrequency": "60s",
            "shutdownGracePeriod": "0s", "containerLogMaxSize": "50Mi",
            "registerNode": True,
            "localStorageCapacityIsolation": True,
            "failCgroupV1": False,
        }
        (k / "config.yaml").write_text(dump(cfg))

    def _install_seccomp_profiles(self) -> None:
        """The chart's seccomp profiles, where the kubelet resolves ``Localhost`` profiles
        (``<root-dir>/seccomp/rft/<name>``), as a platform team installs them on its nodes."""
        dest = self.workdir / "kubelet" / "seccomp" / "rft"
        dest.mkdir(parents=True, exist_ok=True)
        for f in (REPO_ROOT / "charts" / "rft-operator" / "files" / "seccomp").glob("*.json"):
            shutil.copyfile(f, dest / f.name)

    def _write_kube_proxy_config(self) -> None:
        cfg = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.workdir / "kube-proxy.kubeconfig")},
            "hostnameOverride": self.name, "bindAddress": self.net.node_ip,
            "clusterCIDR": self.net.pod_cidr, "mode": "iptables",
            "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
            # Leave the machine's conntrack sysctls alone (global, not the namespace's).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"masqueradeAll": True},
        }
        (self.workdir / "kube-proxy.yaml").write_text(dump(cfg))

    # ---- API objects -----------------------------------------------------------------------------

    def _publish_apiserver_endpoint(self, api_port: int) -> None:
        """The ``kubernetes`` Service's endpoint: the host end of the node's veth (DNATed to the API
        server). The API server publishes none itself (``--endpoint-reconciler-type=none``)."""
        ep = {"apiVersion": "v1", "kind": "Endpoints",
              "metadata": {"name": "kubernetes", "namespace": "default"},
              "subsets": [{"addresses": [{"ip": self.net.host_ip}],
                           "ports": [{"name": "https", "port": api_port, "protocol": "TCP"}]}]}
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=rft-node",
                             "-f", "-", input=json.dumps(ep))

    def _untaint(self) -> None:
        """No node-lifecycle controller runs here: remove the not-ready taint the API server added at
        registration (the kubelet reports Ready; nothing else would ever remove it)."""
        node = json.loads(self.cluster.kubectl("get", "node", self.name, "-o", "json").stdout)
        taints = node["spec"].get("taints") or []
        keep = [t for t in taints if t.get("key") not in ("node.kubernetes.io/not-ready",)]
        if keep != taints:
            patch = [{"op": "replace", "path": "/spec/taints", "value": keep}] if keep else \
                [{"op": "remove", "path": "/spec/taints"}]
            self.cluster.kubectl("patch", "node", self.name, "--type=json", "-p", json.dumps(patch))

    def _install_addons(self, coredns_image: str) -> None:
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=rft-node",
                             "-f", "-", input=addons_manifest(coredns_image, self.name))

    def _policies_enforced(self) -> bool:
        return _run(*self.net.nsenter(), "iptables", "-S", KUBE_ROUTER_CHAIN, check=False).returncode == 0

    def request(self, url: str, headers: dict[str, str] | None = None, timeout: float = 10) -> bytes:
        """GET ``url`` from inside the node's network namespace, as the node itself (a pod's IP is
        reachable only there, and the node is the one source NetworkPolicies always admit, like the
        kubelet's probes). Raises OSError when nothing answers or the status is not 2xx."""
        argv = [*self.net.nsenter(), "curl", "--silent", "--show-error", "--fail", "--max-time", str(timeout)]
        for k, v in (headers or {}).items():
            argv += ["--header", f"{k}: {v}"]
        try:
            p = subprocess.run([*argv, url], capture_output=True, timeout=timeout + 5)
        except subprocess.TimeoutExpired as e:
            raise OSError(f"GET {url}: no answer in {timeout} s") from e
        if p.returncode != 0:
            raise OSError(f"GET {url}: curl exit {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
        return p.stdout

    def _dns_ready(self) -> bool:
        p = self.cluster.kubectl("get", "deployment", "coredns", "-n", "kube-system", "-o",
                                 "jsonpath={.status.readyReplicas}", check=False)
        return p.returncode == 0 and p.stdout.strip() not in ("", "0")

    def ready(self) -> bool:
        p = self.cluster.kubectl("get", "node", self.name, "-o",
                                 'jsonpath={.status.conditions[?(@.type=="Ready")].status}', check=False)
        return p.returncode == 0 and p.stdout.strip() == "True"

    # ---- container logs (the kubelet's podLogsDir, readable on this machine) ---------------------

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "pod-logs"

    def log_texts(self, namespace: str, pod_prefix: str, container: str | None = None) -> list[tuple[str, str]]:
        """``(label, text)`` of every container log of pods ``<pod_prefix>*`` in ``namespace`` still on
        the node (restarts in order), the CRI prefix (time, stream, tag) stripped."""
        out = []
        for pod_dir in sorted(self.logs_dir.glob(f"{namespace}_{pod_prefix}*_*")):
            for cdir in sorted(p for p in pod_dir.iterdir() if p.is_dir()):
                if container and cdir.name != container:
                    continue
                files = sorted(cdir.glob("*.log*"), key=lambda f: int(f.name.split(".")[0]) if f.name.split(".")[0].isdigit() else 0)
                text = "".join(_strip_cri(f.read_text(errors="replace")) for f in files)
                out.append((f"{pod_dir.name.rsplit('_', 1)[0]}/{cdir.name}", text))
        return out

    def logs(self, namespace: str, pod: str, container: str | None = None) -> str:
        return "".join(t for label, t in self.log_texts(namespace, pod, container)
                       if label.split("/")[0] == f"{namespace}_{pod}")

    def dump_logs(self, namespace: str | None = None, limit: int = 4000) -> str:
        parts = []
        for label, text in self.log_texts(namespace or "*", ""):
            parts.append(f"----- {label}\n{text[-limit:]}")
        return "\n".join(parts) or "(no container logs)"

    # ---- processes -----------------------------------------------------------------------------

    def _ctr(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return _run("ctr", f"--address={self.socket}", "-n", "k8s.io", *args, check=check, timeout=timeout)

    def import_image(self, archive: Path, timeout: float = 900) -> None:
        """``ctr -n k8s.io images import`` of an oci-archive into the node's containerd, unless this
        node already imported that archive (its name carries the input hash)."""
        import_archive(self.workdir, archive, timeout)

    def trust_registry(self, address: str) -> None:
        """Let the node's containerd pull from the plain-HTTP registry at ``address`` (``host:port``): its
        ``hosts.toml`` (read at each pull, so no restart) names ``http://address`` as the server, and the
        host admits the node's connections to it (``address`` must be ``host_ip:port``)."""
        host, _, port = address.rpartition(":")
        if host != self.net.host_ip:
            raise NodeError(f"a registry for the node listens on its host-side address {self.net.host_ip}, not {host}")
        self.net.admit_host_port(int(port))
        d = self.workdir / "containerd" / "certs.d" / address
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(f'server = "http://{address}"\n\n[host."http://{address}"]\n'
                                      f'  capabilities = ["pull", "resolve", "push"]\n')

    def push_image(self, ref: str, dest: str, user: str, password: str, timeout: float = 900) -> None:
        """Push the node's image ``ref`` to ``dest`` on a plain-HTTP registry (``ctr images push`` from the
        content the node already holds); the ``dest`` name is removed from the node afterwards."""
        self._ctr("images", "tag", "--force", ref, dest)
        try:
            self._ctr("images", "push", "--plain-http", "--user", f"{user}:{password}", dest, timeout=timeout)
        finally:
            self._ctr("images", "rm", dest, check=False)

    def _launch(self, name: str, argv: list[str], cwd: Path | None = None, cgroup_procs: Path | None = None) -> None:
        log = open(self.log_path(name), "ab")
        env = {**os.environ, "PATH": f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        if name == "provisioner":
            env["PYTHONPATH"] = str(REPO_ROOT)

        def pre() -> None:
            if cgroup_procs is not None:
                cgroup_procs.write_text(str(os.getpid()))
            if self.die_with_parent and name != "containerd":
                set_pdeathsig()
        try:
            log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
            log.flush()
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=cwd or self.workdir,
                                     start_new_session=True, env=env, preexec_fn=pre)
        finally:
            log.close()
        self._pid_path(name).write_text(f"{popen.pid} {proc_start_time(popen.pid) or ''}\n")
        setattr(self, f"_popen_{name.replace('-', '_')}", popen)

    def _read_pid(self, name: str) -> tuple[int, str | None] | None:
        try:
            parts = self._pid_path(name).read_text().split()
        except OSError:
            return None
        return int(parts[0]), (parts[1] if len(parts) > 1 else None)

    def _alive(self, name: str) -> bool:
        rec = self._read_pid(name)
        if rec is None:
            return False
        popen = getattr(self, f"_popen_{name.replace('-', '_')}", None)
        if popen is not None:
            return popen.poll() is None
        st = proc_stat(rec[0])
        return bool(st) and st[0] != "Z" and (not rec[1] or st[19] == rec[1])

    def _wait(self, what: str, deadline: float, watch: list[str], ok) -> None:
        last = ""
        while True:
            for name in watch:
                if self._read_pid(name) is not None and not self._alive(name):
                    raise NodeError(f"{name} exited while waiting for {what}; log {self.log_path(name)}:\n"
                                    f"{tail(self.log_path(name), 30)}")
            try:
                if ok():
                    return
            except (OSError, NodeError, subprocess.SubprocessError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n}:\n{tail(self.log_path(n), 15)}" for n in watch)
                raise NodeError(f"timed out waiting for {what} {last}\n{tails}")
            time.sleep(0.5)

    def stop(self, delete_node: bool = True, purge: bool = False) -> None:
        """Stop everything (see the module docstring) and check that nothing is left. With ``purge``
        the node's images and container filesystems go too (containerd's root and state: gigabytes
        once the runtime and vLLM images are imported), so that a finished test session leaves only
        its logs and volumes on disk; without it a restarted node finds its images imported."""
        for name in ("provisioner", "kube-router", "kube-proxy", "kubelet"):
            rec = self._read_pid(name)
            if rec is not None:
                stop_process_group(rec[0], rec[1], timeout=10)
                self._pid_path(name).unlink(missing_ok=True)
        # Pods, shims and containerd: everything in the node's cgroups.
        self.cgroups.kill_all()
        rec = self._read_pid("containerd")
        if rec is not None:
            stop_process_group(rec[0], rec[1], timeout=5)
            self._pid_path("containerd").unlink(missing_ok=True)
        if self.workdir.exists():
            unmount_under(self.workdir)
        if self._net is not None:
            self._net.delete()
        self.cgroups.delete()
        self._remove_host_files()
        if delete_node and self.cluster.ready():
            self.cluster.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false", check=False)
        left = self.leftovers()
        if left:
            raise NodeError(f"the node left behind: {left}")
        if purge:
            for d in (self.workdir / "containerd" / "root", self.workdir / "containerd" / "state"):
                shutil.rmtree(d, ignore_errors=True)
            (self.workdir / "imported.txt").unlink(missing_ok=True)

    def _remove_host_files(self) -> None:
        """The few paths the kubelet hard-codes outside its root directory: its symlinks in
        /var/log/containers into our pod logs, and its device-plugin socket (when no other local
        node runs)."""
        logs = Path("/var/log/containers")
        if logs.is_dir():
            for link in logs.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(str(self.workdir) + "/"):
                    link.unlink(missing_ok=True)
        others = [p for p in Path("/run/netns").glob("rftn-*")] if Path("/run/netns").exists() else []
        if not others:
            plugins = Path("/var/lib/kubelet/device-plugins")
            (plugins / "kubelet.sock").unlink(missing_ok=True)
            for d in (plugins, plugins.parent, logs):
                try:
                    d.rmdir()
                except OSError:
                    pass

    def leftovers(self) -> list[str]:
        out = list(self.cgroups.leftovers())
        logs = Path("/var/log/containers")
        if logs.is_dir():
            out += [f"log link {p}" for p in logs.iterdir()
                    if p.is_symlink() and os.readlink(p).startswith(str(self.workdir) + "/")]
        if self.workdir.exists():
            out += [f"mount {m}" for m in mounts_under(self.workdir)]
        if self._net is not None:
            out += self._net.leftovers()
        return out


def _strip_cri(text: str) -> str:
    """CRI log lines (``<time> <stream> <P|F> <msg>``) back to the container's output."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[1] in ("stdout", "stderr"):
            out.append(parts[3] + ("" if parts[2] == "P" else "\n"))
        else:
            out.append(line + "\n")
    return "".join(out)


def addons_manifest(coredns_image: str, node_name: str) -> str:
    """CoreDNS (Deployment, Service ``kube-dns`` at :data:`DNS_IP`, its RBAC), kube-router's RBAC and
    the default StorageClass, as one YAML stream. CoreDNS is bound to this node (``nodeName``): another node of the
    same cluster (one without the images) cannot run its image."""
    corefile = f""".:53 {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"""
    docs = [
        # kube-router (a process of the node, user system:kube-router): reads what its NetworkPolicy
        # controller and its informers watch, nothing else
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:kube-router"},
         "rules": [{"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:kube-router"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kube-router"},
         "subjects": [{"kind": "User", "name": "system:kube-router", "apiGroup": "rbac.authorization.k8s.io"}]},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": corefile}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "coredns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                  "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}}, "spec": {
                      "nodeName": node_name, "serviceAccountName": "coredns", "dnsPolicy": "Default",
                      "priorityClassName": "system-cluster-critical",
                      # port 53 as on kubeadm's clusters (where NetworkPolicies that admit DNS by port
                      # see it), without root: the pod's own namespace lets unprivileged binds from 53 up
                      "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                          "seccompProfile": {"type": "RuntimeDefault"},
                                          "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}]},
                      "containers": [{
                          "name": "coredns", "image": coredns_image, "imagePullPolicy": "Never",
                          "args": ["-conf", "/etc/coredns/Corefile"],
                          "ports": [{"containerPort": 53, "name": "dns", "protocol": "UDP"},
                                    {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"}],
                          "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                          "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
                          "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                              "capabilities": {"drop": ["ALL"]}},
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                      }],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]}}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
         "spec": {"selector": {"k8s-app": "kube-dns"}, "clusterIP": DNS_IP,
                  "ports": [{"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "targetPort": 53, "protocol": "TCP"}]}},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": STORAGE_CLASS,
                      "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
         "provisioner": PROVISIONER_NAME, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"},
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def main(argv: list[str] | None = None) -> int:
    """``python -m e2e.node load-images --dir .cluster``: import the archives hack/build-images.sh
    listed into that cluster's node."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m e2e.node")
    ap.add_argument("command", choices=("load-images",))
    ap.add_argument("--dir", default=".cluster", type=Path)
    a = ap.parse_args(argv)
    workdir = node_workdir(a.dir)
    listing = cache_dir() / "images" / "images.txt"
    for line in listing.read_text().splitlines():
        ref, archive = line.split()
        t0 = time.monotonic()
        import_archive(workdir, Path(archive))
        print(f"[node] {ref} imported in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
