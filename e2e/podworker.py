"""One pod's life on the process kubelet (TEST INFRASTRUCTURE): a thread per pod.

The worker sets up the pod's "sandbox" (a loopback IP, a hosts file, its volumes), runs init
containers in order, then the containers, each through ``e2e/podexec.py``; it runs probes, restarts
containers by the restart policy with exponential back-off, enforces ``activeDeadlineSeconds``,
writes the pod's status whenever it changes, and on deletion SIGTERMs every container, SIGKILLs
them after the (capped) grace period and deletes the pod object with grace 0, as a kubelet does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import podenv, proctree
from .kubeapi import ApiError, KubeApi
from .podlaunch import SYSTEM_PATH, ImageEntry, launch_spec, launcher
from .podnet import HostsFiles, IpAllocator, PodEndpoint
from .podstatus import ContainerRecord, PodView, comparable, now_iso, pod_status
from .podvolumes import PodVolumes, VolumeError
from .probes import ProbeContext, ProbeRunner

Obj = dict[str, Any]
log = logging.getLogger("e2e.kubelet")


@dataclass
class Settings:
    """Knobs of the process kubelet that a real kubelet does not have or that tests shorten."""

    grace_cap_s: float = 10.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 20.0
    volume_refresh_s: float = 10.0
    enforce_read_only_root: bool = True


@dataclass
class WorkerEnv:
    """What a worker gets from its kubelet."""

    api: KubeApi
    node_name: str
    workdir: Path
    host_ip: str
    api_host: str
    api_port: int
    allocatable: dict[str, str]
    resolve_image: Callable[[str], "ImageEntry | None"]
    ips: IpAllocator
    hosts: HostsFiles
    hosts_changed: Callable[..., None]  # (sync: bool = False)
    cgroups: proctree.CgroupRoot
    settings: Settings
    event: Callable[[Obj, str, str, str], None]
    log_path: Callable[[str, str, str], Path]
    finished: Callable[[str], None]
    launched: Callable[[proctree.ContainerProcess], None]


@dataclass
class _Instance:
    proc: proctree.ContainerProcess
    spec_path: Path
    error_path: Path
    env: dict[str, str]
    cwd: str
    probes: list[ProbeRunner] = field(default_factory=list)
    kill_reason: str = ""  # why the kubelet is killing it (liveness, startup, deletion)


class PodWorker:
    """Runs one pod (by uid) until it is deleted or the kubelet stops."""

    def __init__(self, env: WorkerEnv, pod: Obj) -> None:
        self.env = env
        self.pod = pod
        meta = pod["metadata"]
        self.uid, self.namespace, self.name = meta["uid"], meta["namespace"], meta["name"]
        self.dir = env.workdir / "pods" / self.uid
        self.hosts_path = self.dir / "hosts"
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.init_specs = list(spec.get("initContainers") or [])
        self.main_specs = list(spec.get("containers") or [])
        self.records: dict[str, ContainerRecord] = {}
        for c in self.init_specs:
            self.records[c["name"]] = ContainerRecord(c["name"], c.get("image", ""), init=True,
                                                      sidecar=c.get("restartPolicy") == "Always",
                                                      reason="PodInitializing")
        for c in self.main_specs:
            waiting = "PodInitializing" if self.init_specs else "ContainerCreating"
            self.records[c["name"]] = ContainerRecord(c["name"], c.get("image", ""), reason=waiting)
        self.view = PodView(restart_policy=self.restart_policy, host_ip=env.host_ip,
                            readiness_gates=[g["conditionType"] for g in spec.get("readinessGates") or []])
        self.pod_ip: str | None = None
        self.volumes: PodVolumes | None = None
        self._inst: dict[str, _Instance] = {}
        self._next_start: dict[str, float] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._gone = threading.Event()
        self._shutdown = threading.Event()
        self._deletion_seen = threading.Event()
        self._pushed: Obj | None = None
        self._last_refresh = time.monotonic()
        self._started_mono = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"pod-{self.namespace}-{self.name}", daemon=True)

    # ------------------------------------------------------------------------------ control (any thread)

    def start(self) -> PodWorker:
        self._thread.start()
        return self

    def update(self, pod: Obj) -> None:
        """A newer version of the pod object from the informer."""
        with self._lock:
            self.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                self._deletion_seen.set()
        self._wake.set()

    def gone(self) -> None:
        """The pod object no longer exists (force-deleted): stop its containers now."""
        self._gone.set()
        self._wake.set()

    def shutdown(self) -> None:
        """The kubelet stops: kill the containers, write nothing to the API."""
        self._shutdown.set()
        self._wake.set()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def active(self) -> bool:
        """Not (yet) in a terminal phase."""
        return self._phase() not in ("Succeeded", "Failed")

    def container_processes(self) -> list[proctree.ContainerProcess]:
        with self._lock:
            return [i.proc for i in self._inst.values()]

    # ------------------------------------------------------------------------------ the loop

    def _deletion_requested(self) -> bool:
        return self._deletion_seen.is_set() or bool(self.pod["metadata"].get("deletionTimestamp"))

    def _run(self) -> None:
        try:
            if self._terminal_already():
                self._idle_until_deleted()
                return
            self._sandbox()
            while not (self._gone.is_set() or self._shutdown.is_set() or self._deletion_requested()):
                self._tick()
                self._publish()
                if self._phase() in ("Succeeded", "Failed"):
                    self._kill_all(self._grace())  # sidecars end with the pod
                    self._publish()
                    self._idle_until_deleted()
                    return
                self._wake.wait(0.25)
                self._wake.clear()
            self._terminate()
        except Exception:  # noqa: BLE001 - never leave processes behind because of a bug here
            log.exception("pod %s/%s: worker failed", self.namespace, self.name)
            self._kill_all(0.0)
        finally:
            self._cleanup()
            self.env.finished(self.uid)

    def _terminal_already(self) -> bool:
        return (self.pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    def _idle_until_deleted(self) -> None:
        while not (self._gone.is_set() or self._shutdown.is_set()):
            if self._deletion_requested():
                self._kill_all(0.0)
                self._delete_object()
                return
            self._wake.wait(1.0)
            self._wake.clear()

    def _phase(self) -> str:
        from .podstatus import phase

        return phase(self._records(True), self._records(False), self.view)

    def _records(self, init: bool) -> list[ContainerRecord]:
        specs = self.init_specs if init else self.main_specs
        return [self.records[c["name"]] for c in specs]

    # ------------------------------------------------------------------------------ sandbox

    def _sandbox(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.view.start_time = now_iso()
        if self.pod["spec"].get("hostNetwork"):
            self.pod_ip = self.env.host_ip
        else:
            self.pod_ip = self.env.ips.allocate(f"{self.namespace}/{self.name}")
        self.view.pod_ip = self.pod_ip
        self._endpoint()
        self.env.hosts_changed(True)  # the hosts file exists before any container starts
        self.volumes = PodVolumes(self.pod, self.dir / "volumes", self.env.api, pod_ip=self.pod_ip,
                                  host_ip=self.env.host_ip, allocatable=self.env.allocatable)
        while not (self._gone.is_set() or self._shutdown.is_set() or self._deletion_requested()):
            try:
                self.volumes.prepare()
                self.view.sandbox_ready = True
                return
            except (VolumeError, ApiError, OSError) as e:
                self.env.event(self.pod, "Warning", "FailedMount", str(e))
                self._publish()
            self._wake.wait(1.0)
            self._wake.clear()

    def _endpoint(self) -> None:
        spec, meta = self.pod["spec"], self.pod["metadata"]
        ready = self._phase() == "Running" and all(r.ready for r in self._records(False))
        ep = PodEndpoint(self.namespace, self.name, self.pod_ip, dict(meta.get("labels") or {}), ready=ready,
                         running=self._phase() == "Running",
                         terminating=bool(meta.get("deletionTimestamp")) or self.view.deleting,
                         hostname=spec.get("hostname", ""), subdomain=spec.get("subdomain", ""))
        if self.env.hosts.set(self.uid, ep, self.hosts_path):
            self.env.hosts_changed()

    # ------------------------------------------------------------------------------ containers

    def _tick(self) -> None:
        now = time.monotonic()
        self._check_deadline()
        if self.volumes is not None and now - self._last_refresh > self.env.settings.volume_refresh_s:
            self._last_refresh = now
            try:
                self.volumes.refresh()
            except (VolumeError, ApiError, OSError) as e:
                log.info("pod %s/%s: volume refresh: %s", self.namespace, self.name, e)
        for name in list(self._inst):
            self._watch_instance(name)
        if self.view.failed_reason:
            return
        for spec in self.init_specs:
            rec = self.records[spec["name"]]
            if rec.sidecar:
                if rec.state != "running" and not rec.done:
                    self._maybe_start(spec)
                if not rec.started:
                    return
                continue
            if rec.done:
                if rec.exit_code != 0:
                    return  # the pod failed
                continue
            if rec.state != "running":
                self._maybe_start(spec)
            return  # init containers run one at a time, in order
        for spec in self.main_specs:
            rec = self.records[spec["name"]]
            if rec.state != "running" and not rec.done:
                self._maybe_start(spec)

    def _check_deadline(self) -> None:
        ads = self.pod["spec"].get("activeDeadlineSeconds")
        if ads and not self.view.failed_reason and time.monotonic() - self._started_mono > float(ads):
            self.view.failed_reason = "DeadlineExceeded"
            self.view.failed_message = "Pod was active on the node longer than the specified deadline"
            self.env.event(self.pod, "Normal", "DeadlineExceeded", self.view.failed_message)
            self._kill_all(self._grace())
            for rec in self.records.values():
                rec.done = True

    def _container_policy(self, spec: Obj) -> str:
        rec = self.records[spec["name"]]
        if rec.sidecar:
            return "Always"
        if rec.init:
            return "Never" if self.restart_policy == "Never" else "OnFailure"
        return self.restart_policy

    def _maybe_start(self, spec: Obj) -> None:
        name = spec["name"]
        if time.monotonic() < self._next_start.get(name, 0.0):
            return
        rec = self.records[name]
        try:
            self._start(spec, rec)
        except (podenv.EnvError, VolumeError, ApiError, ValueError) as e:
            rec.state, rec.reason, rec.message = "waiting", "CreateContainerConfigError", str(e)
            self.env.event(self.pod, "Warning", "Failed", f"Error: {e}")
            self._next_start[name] = time.monotonic() + 1.0

    def _image(self, spec: Obj, rec: ContainerRecord) -> ImageEntry | None:
        entry = self.env.resolve_image(spec.get("image", ""))
        if entry is None:
            rec.state, rec.reason = "waiting", "ImageNotMapped"
            rec.message = (f"image {spec.get('image')!r} is not in the process kubelet's image map "
                           f"(map an image or repository prefix to a bin directory)")
            self.env.event(self.pod, "Warning", "Failed", rec.message)
            self._next_start[spec["name"]] = time.monotonic() + 2.0
        return entry

    def _start(self, spec: Obj, rec: ContainerRecord) -> None:
        image = self._image(spec, rec)
        if image is None:
            return
        assert self.volumes is not None
        k8s_env = podenv.container_env(
            self.pod, spec, pod_ip=self.pod_ip, host_ip=self.env.host_ip,
            service_env=podenv.api_server_env(self.env.api_host, self.env.api_port),
            get_object=self.env.api.get, allocatable=self.env.allocatable)
        mounts = self.volumes.mounts(spec, k8s_env)
        n = rec.restart_count + (1 if rec.ever_ran else 0)
        spec_path, error_path = self.dir / f"{spec['name']}-{n}.json", self.dir / f"{spec['name']}-{n}.err"
        error_path.unlink(missing_ok=True)
        cgroup = self.env.cgroups.child(f"{self.uid}_{spec['name']}_{n}")
        launch = launch_spec(self.pod, spec, image, k8s_env=k8s_env, mounts=mounts, hosts_path=self.hosts_path,
                             cgroup=cgroup, error_path=error_path,
                             enforce_read_only_root=self.env.settings.enforce_read_only_root)
        spec_path.write_text(json.dumps(launch, indent=1))
        os.chmod(spec_path, 0o600)  # it holds the env (secrets)
        if rec.ever_ran:
            rec.restart_count += 1
        proc = proctree.launch([*launcher(), "run", str(spec_path)],
                               log_path=self.env.log_path(self.namespace, self.name, spec["name"]),
                               env={"PATH": SYSTEM_PATH}, cgroup=cgroup)
        self.env.launched(proc)
        inst = _Instance(proc, spec_path, error_path, launch["env"], launch["cwd"])
        with self._lock:
            self._inst[spec["name"]] = inst
            rec.state, rec.reason, rec.message = "running", "", ""
            rec.started_at, rec.finished_at, rec.exit_code = now_iso(), None, None
            rec.container_id = f"process://{self.env.node_name}/{proc.pid}"
            rec.image_id = f"process://{image.bin_dir}"
            rec.ever_ran = True
            rec.started = "startupProbe" not in spec
            rec.ready = rec.started and "readinessProbe" not in spec and not rec.init
        self.env.event(self.pod, "Normal", "Started", f"Started container {spec['name']}")
        self._start_probes(spec, inst, startup_done=rec.started)

    def _start_probes(self, spec: Obj, inst: _Instance, startup_done: bool) -> None:
        ports = {p["name"]: int(p["containerPort"]) for p in spec.get("ports") or [] if p.get("name")}
        ctx = ProbeContext(self.pod_ip or self.env.host_ip, ports, inst.proc.pid, inst.env, inst.cwd, self.dir,
                           launcher())
        kinds = ("readiness", "liveness") if startup_done else ("startup",)
        if self.records[spec["name"]].init and not self.records[spec["name"]].sidecar:
            return  # regular init containers have no probes
        for kind in kinds:
            probe = spec.get(f"{kind}Probe")
            if probe:
                runner = ProbeRunner(kind, probe, ctx, spec["name"], self._probe_callback(spec, inst))
                inst.probes.append(runner.start())

    def _probe_callback(self, spec: Obj, inst: _Instance) -> Callable[[str, bool, str], None]:
        name = spec["name"]

        def on_change(kind: str, ok: bool, message: str) -> None:
            probe = kind.removesuffix("-miss")
            if not ok:  # every failed check is an event (rate-limited by the kubelet)
                self.env.event(self.pod, "Warning", "Unhealthy", f"{probe.capitalize()} probe failed: {message}")
            if kind.endswith("-miss"):
                return
            with self._lock:
                if self._inst.get(name) is not inst:
                    return  # a late result of an earlier instance
                rec = self.records[name]
                if kind == "readiness":
                    rec.ready = ok
                elif kind == "startup" and ok:
                    rec.started = True
                    rec.ready = "readinessProbe" not in spec
                    self._start_probes(spec, inst, startup_done=True)
                elif kind in ("startup", "liveness") and not ok:
                    inst.kill_reason = f"Container {name} failed {kind} probe, will be restarted ({message})"
            self._wake.set()

        return on_change

    def _watch_instance(self, name: str) -> None:
        inst = self._inst[name]
        if inst.kill_reason and inst.proc.poll() is None:
            self.env.event(self.pod, "Normal", "Killing", inst.kill_reason)
            spec = next(s for s in [*self.init_specs, *self.main_specs] if s["name"] == name)
            probe_grace = (spec.get("livenessProbe") or {}).get("terminationGracePeriodSeconds")
            inst.proc.terminate(self._grace(probe_grace))
        code = inst.proc.poll()
        if code is None:
            return
        inst.proc.kill_leftovers()
        for p in inst.probes:
            p.stop()
        spec = next(s for s in [*self.init_specs, *self.main_specs] if s["name"] == name)
        with self._lock:
            del self._inst[name]
            rec = self.records[name]
            rec.state, rec.exit_code, rec.finished_at = "terminated", code, now_iso()
            rec.ready = rec.started = False
            if inst.error_path.exists():
                rec.reason, rec.message = "StartError", inst.error_path.read_text().strip()
            else:
                rec.reason, rec.message = ("Completed" if code == 0 else "Error"), inst.kill_reason
            policy = self._container_policy(spec)
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
            if not restart:
                rec.done = True
                return
            rec.last_terminated = rec.terminated()
            delay = self._backoff(rec.restart_count)
            self._next_start[name] = time.monotonic() + delay
            if delay > 0:
                rec.state, rec.reason = "waiting", "CrashLoopBackOff"
                rec.message = f"back-off {delay:g}s restarting failed container={name} pod={self.name}_{self.namespace}"
                self.env.event(self.pod, "Warning", "BackOff", f"Back-off restarting failed container {name}")

    def _backoff(self, restarts: int) -> float:
        s = self.env.settings
        return 0.0 if restarts == 0 else min(s.backoff_base_s * 2 ** (restarts - 1), s.backoff_max_s)

    # ------------------------------------------------------------------------------ status

    def _publish(self) -> None:
        """Write the pod's status when it changed; update name resolution."""
        self._endpoint()
        if self._shutdown.is_set() or self._gone.is_set():
            return
        with self._lock:
            status = pod_status(self.pod.get("status") or {}, self._records(True), self._records(False), self.view)
        if self._pushed is not None and comparable(status) == comparable(self._pushed):
            return
        for _ in range(5):
            cur = self.env.api.get("Pod", self.namespace, self.name)
            if cur is None or cur["metadata"]["uid"] != self.uid:
                self._gone.set()
                return
            with self._lock:
                status = pod_status(cur.get("status") or {}, self._records(True), self._records(False), self.view)
            cur["status"] = status
            try:
                new = self.env.api.replace("Pod", self.namespace, self.name, cur, subresource="status")
            except ApiError as e:
                if e.status == 409:
                    continue
                if e.status == 404:
                    self._gone.set()
                    return
                log.warning("pod %s/%s: status write failed: %s", self.namespace, self.name, e)
                return
            with self._lock:
                self.pod = new
            self._pushed = status
            return

    # ------------------------------------------------------------------------------ termination

    def _grace(self, override: Any = None) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        grace = override if override is not None else meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        return max(0.0, min(float(grace), self.env.settings.grace_cap_s))

    def _kill_all(self, grace: float) -> None:
        with self._lock:
            insts = dict(self._inst)
        for inst in insts.values():
            for p in inst.probes:
                p.stop()
            inst.proc.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not all(i.proc.gone() for i in insts.values()):
            time.sleep(0.05)
        failures = []
        for name, inst in insts.items():
            try:
                code = inst.proc.terminate(0.0)
            except RuntimeError as e:
                failures.append(str(e))
                continue
            with self._lock:
                self._inst.pop(name, None)
                rec = self.records[name]
                rec.state, rec.exit_code, rec.finished_at, rec.ready = "terminated", code, now_iso(), False
                rec.reason = "Completed" if code == 0 else "Error"
                rec.done = True
        if failures:
            raise RuntimeError("; ".join(failures))

    def _terminate(self) -> None:
        """Deletion (graceful, capped), force deletion (pod object gone) or kubelet shutdown."""
        self.view.deleting = True
        self._endpoint()
        if self._shutdown.is_set():
            self._kill_all(min(2.0, self._grace()))
            return
        grace = 2.0 if self._gone.is_set() else self._grace()
        self.env.event(self.pod, "Normal", "Killing", f"Stopping pod (grace period {grace:g}s)")
        self._kill_all(grace)
        for rec in self.records.values():
            if not rec.done:
                rec.done = True
                if rec.state == "waiting":
                    rec.state, rec.reason, rec.exit_code = "terminated", "ContainerStatusUnknown", 137
        if not self._gone.is_set():
            self._publish()
            self._delete_object()

    def _delete_object(self) -> None:
        try:
            self.env.api.delete("Pod", self.namespace, self.name,
                                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
        except ApiError as e:
            if e.status != 409:  # 409: a newer pod of the same name
                log.warning("pod %s/%s: delete failed: %s", self.namespace, self.name, e)

    def _cleanup(self) -> None:
        self.env.hosts.remove(self.uid)
        self.env.hosts_changed()
        if self.pod_ip and self.pod_ip != self.env.host_ip:
            self.env.ips.release(self.pod_ip)
        if self.volumes is not None:
            self.volumes.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)  # specs, hosts file; logs live in <workdir>/logs
