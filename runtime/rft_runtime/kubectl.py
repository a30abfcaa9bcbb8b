"""``kubectl rft``: a kubectl plugin for RFTJobs (the console script ``kubectl-rft``).

::

    kubectl rft status JOB            phase, step/total, reward trend (sparkline), last checkpoint,
                                      per-domain rewards, roles ready/desired
    kubectl rft logs JOB --role R     the logs of the job's pods in role R (inference, rollout,
                                      reward, trainer); -f follows one pod
    kubectl rft suspend JOB           spec.suspend: true (role pods removed, checkpoint kept; warns when Argo CD
                                      manages the job: its Git holds spec.suspend)
    kubectl rft resume JOB            spec.suspend: false (the trainer resumes from its checkpoint); a Failed
                                      job is retried in place: annotation rft.dev/retry, it resumes from its
                                      latest checkpoint
    kubectl rft curve JOB -o F.png    the reward curve from the job's progress record
    kubectl rft samples JOB           the newest sampled completions the trainer kept (prompts,
                                      completions, rewards, the evaluator's reasons); --step N an
                                      earlier kept step, -o json as JSON
    kubectl rft export JOB DIR        copy the trained model (``status.finalModel``) out of its claim
                                      into DIR (``--merged``: the merged copy of a LoRA adapter)

Credentials and the default namespace come from the kubeconfig (``$KUBECONFIG`` or
``~/.kube/config``, its current context), as for kubectl; ``-n`` and ``--kubeconfig`` override them.
It reads the RFTJob, its progress ConfigMap and its pods, and writes only ``spec.suspend`` and the
``rft.dev/retry`` annotation, except
``export``: it starts a short-lived pod (``<job>-export-<random>``, the job's runtime image, the claim
mounted read-only, non-root, no capabilities, RuntimeDefault seccomp), streams the model directory
out of it as a tar archive through ``kubectl exec`` (the kubectl that runs the plugin), unpacks it
into DIR refusing any member that would land outside it, and deletes the pod.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence, cast

from rft_api.constants import API_VERSION, KIND, RETRY_ANNOTATION
from rft_api.progress import PROGRESS_KEY, SAMPLES_KEY, Progress, ProgressError, parse_text

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "rftjobs"
ROLES = ("inference", "rollout", "reward", "trainer")
SPARK = "▁▂▃▄▅▆▇█"


class PluginError(Exception):
    """A failure to report in one line (exit 1)."""


def sparkline(values: Sequence[Optional[float]], width: int = 40) -> str:
    """The values as a line of block characters (the last ``width`` of them; gaps as spaces)."""
    vals = list(values)[-width:]
    finite = [v for v in vals if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    lo, hi = min(finite), max(finite)
    span = hi - lo
    out = []
    for v in vals:
        if v is None or not math.isfinite(v):
            out.append(" ")
        else:
            out.append(SPARK[int(round((v - lo) / span * (len(SPARK) - 1))) if span > 0 else len(SPARK) // 2])
    return "".join(out)


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def format_status(job: dict[str, Any], progress: Optional[Progress]) -> str:
    """The lines ``kubectl rft status`` prints."""
    meta, spec, st = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    total = st.get("totalSteps") or (spec.get("trainer") or {}).get("maxSteps")
    lines = [f"{meta['namespace']}/{meta['name']}: {st.get('phase', 'Pending')} — {st.get('message', '')}".rstrip(" —"),
             f"step        {st.get('step', 0)}/{total if total is not None else '?'}"
             f"   policy version {st.get('policyVersion', 0)}   restarts {st.get('restarts', 0)}"]
    mean, std = st.get("rewardMean"), st.get("rewardStd")
    reward = f"reward      {_fmt(mean)}" + (f" ± {std:.3f}" if std is not None else "")
    if progress is not None and progress.reward_curve:
        curve = [p.mean for p in progress.reward_curve]
        first = next((v for v in curve if v is not None), None)
        reward += f"   {sparkline(curve)}   (step {progress.reward_curve[0].step}: {_fmt(first)})"
    lines.append(reward)
    domains = st.get("domainRewards") or (progress.domain_rewards if progress is not None else {})
    if domains:
        lines.append("by domain   " + "   ".join(f"{d} {_fmt(v)}" for d, v in sorted(domains.items())))
    ev = st.get("evaluation") or {}
    if ev.get("score") is not None:
        line = f"eval score  {_fmt(ev['score'])} at step {ev.get('step')}"
        if ev.get("baseline") is not None:
            line += f"   baseline {_fmt(ev['baseline'])}"
        if ev.get("bestScore") is not None:
            line += f"   best {_fmt(ev['bestScore'])} at step {ev.get('bestStep')}"
        if progress is not None and progress.evaluation is not None and len(progress.evaluation.curve) > 1:
            line += f"   {sparkline([p.score for p in progress.evaluation.curve])}"
        lines.append(line)
        if ev.get("bestCheckpoint"):
            lines.append(f"best        {ev['bestCheckpoint']}")
    elif st.get("evalScore") is not None:
        lines.append(f"eval score  {_fmt(st['evalScore'])}")
    eval_domains = st.get("evalDomainScores") or (progress.eval_domain_scores if progress is not None else {})
    if eval_domains:
        lines.append("eval by domain  " + "   ".join(f"{d} {_fmt(v)}" for d, v in sorted(eval_domains.items())))
    ckpt = st.get("lastCheckpoint")
    lines.append(f"checkpoint  step {ckpt['step']} at {ckpt['path']}" if ckpt else "checkpoint  none yet")
    roles = st.get("roles") or {}
    lines.append("roles       " + "   ".join(f"{r} {(roles.get(r) or {}).get('ready', 0)}/{(roles.get(r) or {}).get('desired', 0)}"
                                            for r in ROLES))
    errors = st.get("errors") or {}
    if any(errors.values()):
        lines.append("errors      " + "   ".join(f"{k} {v}" for k, v in sorted(errors.items()) if v))
    return "\n".join(lines)


class Client:
    """The few API calls the plugin makes (the official Kubernetes client)."""

    def __init__(self, kubeconfig: Optional[str], namespace: Optional[str]) -> None:
        from kubernetes import client, config

        try:
            config.load_kube_config(config_file=kubeconfig)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except Exception as e:  # no kubeconfig: explain, as kubectl would
            raise PluginError(f"cannot load the kubeconfig: {e}") from None
        self.namespace = namespace or (active.get("context") or {}).get("namespace") or "default"
        self.core = client.CoreV1Api()
        self.custom = client.CustomObjectsApi()

    def _api_error(self, e: Exception, what: str) -> PluginError:
        status = getattr(e, "status", None)
        if status == 404:
            return PluginError(f"{what} not found in namespace {self.namespace}")
        return PluginError(f"{what}: {getattr(e, 'reason', '') or e}")

    def job(self, name: str) -> dict[str, Any]:
        try:
            return cast("dict[str, Any]", self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                                  PLURAL, name))
        except Exception as e:
            raise self._api_error(e, f"{KIND} {name}") from None

    def _progress_key(self, name: str, key: str) -> Optional[str]:
        """One key of the job's progress ConfigMap (None when the ConfigMap or the key is not there yet)."""
        try:
            cm = self.core.read_namespaced_config_map(f"{name}-progress", self.namespace)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise self._api_error(e, f"ConfigMap {name}-progress") from None
        return (cm.data or {}).get(key) or None

    def progress(self, name: str) -> Optional[Progress]:
        text = self._progress_key(name, PROGRESS_KEY)
        if not text:
            return None
        try:
            return parse_text(text)
        except ProgressError:
            return None

    def samples(self, name: str) -> Optional[str]:
        """The ``samples.json`` text of the job's progress ConfigMap (None when there is none yet)."""
        return self._progress_key(name, SAMPLES_KEY)

    def set_suspend(self, name: str, suspend: bool) -> dict[str, Any]:
        """Patches ``spec.suspend``; returns the job as it was read before the patch."""
        job = self.job(name)
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                       {"spec": {"suspend": suspend}})
        except Exception as e:
            raise self._api_error(e, f"{KIND} {name}") from None
        return job

    def retry(self, name: str, job: dict[str, Any]) -> int:
        """Asks the operator to retry the Failed ``job`` in place (annotation :data:`RETRY_ANNOTATION` one
        above ``status.retry.count``); returns that number."""
        count = int(((job.get("status") or {}).get("retry") or {}).get("count") or 0) + 1
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                       {"metadata": {"annotations": {RETRY_ANNOTATION: str(count)}}})
        except Exception as e:
            raise self._api_error(e, f"{KIND} {name}") from None
        return count

    def pods(self, name: str, role: str) -> list[Any]:
        sel = f"app.kubernetes.io/instance={name},rft.dev/role={role}"
        return sorted(self.core.list_namespaced_pod(self.namespace, label_selector=sel).items,
                      key=lambda p: p.metadata.name)

    def create_pod(self, body: dict[str, Any]) -> None:
        try:
            self.core.create_namespaced_pod(self.namespace, body)  # type: ignore[arg-type]  # a dict body is sent as is
        except Exception as e:
            raise self._api_error(e, f"creating pod {body['metadata']['name']}") from None

    def wait_running(self, pod: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                p = self.core.read_namespaced_pod(pod, self.namespace)
            except Exception as e:
                raise self._api_error(e, f"pod {pod}") from None
            phase = p.status.phase if p.status else None
            if phase == "Running":
                return
            if phase in ("Succeeded", "Failed") or time.monotonic() > deadline:
                waiting = [cs.state.waiting.reason for cs in (p.status.container_statuses or [])
                           if cs.state and cs.state.waiting] if p.status else []
                raise PluginError(f"pod {pod} did not start within {timeout:.0f}s (phase {phase}"
                                  f"{', ' + ', '.join(waiting) if waiting else ''})")
            time.sleep(1.0)

    def delete_pod(self, pod: str) -> None:
        try:
            self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=0)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                print(f"warning: pod {pod} was not deleted: {getattr(e, 'reason', '') or e}", file=sys.stderr)

    def log(self, pod: str, container: str, tail: Optional[int], follow: bool) -> Any:
        kw: dict[str, Any] = {"container": container, "follow": follow, "_preload_content": not follow}
        if tail is not None:
            kw["tail_lines"] = tail
        try:
            return self.core.read_namespaced_pod_log(pod, self.namespace, **kw)
        except Exception as e:
            raise self._api_error(e, f"logs of pod {pod}") from None


EXPORT_MOUNT = "/model-claim"
EXPORT_UID = 1000  # the builders' uid (the runtime image's user)


def export_source(job: dict[str, Any], merged: bool) -> tuple[str, str]:
    """(claim, directory on it) of the job's trained model, from ``status.finalModel``."""
    name = job["metadata"]["name"]
    st = job.get("status") or {}
    final = st.get("finalModel")
    if not final:
        raise PluginError(f"{name} has no final model (phase {st.get('phase') or 'Pending'}): the trainer writes "
                          "it when the job Succeeds")
    path = final.get("mergedPath") if merged else final.get("path")
    if not path:
        raise PluginError(f"{name}'s final model is a {final.get('format')} model without a merged copy "
                          "(spec.checkpoint.mergeFinalAdapter): export it without --merged")
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts:
        raise PluginError(f"{name}: status.finalModel names {path!r}, not a directory on its claim")
    return final["claim"], path


def export_pod(job: dict[str, Any], claim: str, name: str, image: str) -> dict[str, Any]:
    """The short-lived pod that mounts ``claim`` read-only for ``kubectl rft export``, running ``image``."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "rft-export",
                                              "app.kubernetes.io/instance": job["metadata"]["name"]}},
        "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "activeDeadlineSeconds": 3600,
            "securityContext": {"runAsNonRoot": True, "runAsUser": EXPORT_UID, "runAsGroup": EXPORT_UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "export", "image": image, "command": ["sleep", "3600"],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "model", "mountPath": EXPORT_MOUNT, "readOnly": True}],
            }],
            "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
        },
    }


def unpack(stream: Any, dest: Path) -> list[str]:
    """Extract a tar stream into ``dest``: regular files and directories only, none outside ``dest``."""
    names = []
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            target = (dest / m.name).resolve()
            if not (m.isfile() or m.isdir()) or (target != dest.resolve() and dest.resolve() not in target.parents):
                raise PluginError(f"the archive holds {m.name!r}, which is not a file or directory inside {dest}")
            tar.extract(m, dest, filter="data")
            if m.isfile():
                names.append(m.name.removeprefix("./"))
    return sorted(names)


def export_image(c: Client, job: dict[str, Any], image: Optional[str]) -> str:
    """The export pod's image: ``--image``, else the job's ``spec.runtimeImage``, else the image its trainer
    pods ran (the operator's configured runtime image when the job names none)."""
    chosen = image or (job.get("spec") or {}).get("runtimeImage")
    if chosen:
        return str(chosen)
    name = job["metadata"]["name"]
    for pod in c.pods(name, "trainer"):
        for container in pod.spec.containers or []:
            if container.name == "trainer" and container.image:
                return str(container.image)
    raise PluginError(f"{name} names no spec.runtimeImage and has no trainer pod left to take the image from: "
                      "name one with --image (the operator's runtime image, chart value images.runtime)")


def _export(c: Client, a: argparse.Namespace) -> int:
    job = c.job(a.job)
    claim, path = export_source(job, a.merged)
    dest = Path(a.dir)
    if dest.exists() and any(dest.iterdir()):
        raise PluginError(f"{dest} is not empty")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise PluginError("kubectl is not on PATH (export streams the model through kubectl exec)")
    pod = f"{a.job}-export-{secrets.token_hex(3)}"[:63]
    c.create_pod(export_pod(job, claim, pod, export_image(c, job, a.image)))
    try:
        c.wait_running(pod, a.timeout)
        cmd = [kubectl, "exec", "-n", c.namespace, pod, "-c", "export", "--",
               "tar", "cf", "-", "-C", f"{EXPORT_MOUNT}/{path}", "."]
        if a.kubeconfig:
            cmd[1:1] = ["--kubeconfig", a.kubeconfig]
        dest.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
        assert proc.stdout is not None and proc.stderr is not None
        try:
            files = unpack(proc.stdout, dest)
        finally:
            err = proc.stderr.read().decode(errors="replace")
            rc = proc.wait()
        if rc != 0:
            raise PluginError(f"reading {path} from claim {claim} failed: {err.strip()[-500:]}")
    finally:
        c.delete_pod(pod)
    size = sum((dest / f).stat().st_size for f in files)
    print(f"exported {claim}:{path} of {c.namespace}/{a.job} to {dest} ({len(files)} files, {size / 1e6:.1f} MB)")
    return 0


def _status(c: Client, a: argparse.Namespace) -> int:
    print(format_status(c.job(a.job), c.progress(a.job)))
    return 0


ARGO_PREFIX = "argocd.argoproj.io/"


def argo_marks(job: dict[str, Any]) -> list[str]:
    """The Argo CD tracking marks on a job's metadata (its annotations' and labels' ``argocd.argoproj.io/*``
    keys, e.g. ``argocd.argoproj.io/tracking-id``): an object Argo CD manages."""
    meta = job.get("metadata") or {}
    return sorted(k for part in ("annotations", "labels") for k in (meta.get(part) or {}) if k.startswith(ARGO_PREFIX))


def _retry(c: Client, a: argparse.Namespace, job: dict[str, Any]) -> int:
    """``resume`` of a Failed job: retried in place from its latest checkpoint."""
    n = c.retry(a.job, job)
    failed = next((x for x in (job.get("status") or {}).get("conditions") or []
                   if x.get("type") == "Failed" and x.get("status") == "True"), {})
    print(f"{KIND.lower()} {c.namespace}/{a.job} retried ({RETRY_ANNOTATION}={n}): it resumes from its latest "
          f"checkpoint; it had failed with {failed.get('reason', 'an error')}: {failed.get('message', '')}"[:600])
    return 0


def _suspend(c: Client, a: argparse.Namespace) -> int:
    if a.command == "resume":
        current = c.job(a.job)
        if (current.get("status") or {}).get("phase") == "Failed":
            return _retry(c, a, current)
    job = c.set_suspend(a.job, a.command == "suspend")
    marks = argo_marks(job)
    if marks:
        print(f"warning: {KIND.lower()} {c.namespace}/{a.job} is managed by Argo CD ({', '.join(marks)}): it reverts "
              "this change (self-heal) or shows the job OutOfSync; set spec.suspend in Git instead", file=sys.stderr)
    print(f"{KIND.lower()} {c.namespace}/{a.job} {'suspended' if a.command == 'suspend' else 'resumed'}")
    return 0


def _logs(c: Client, a: argparse.Namespace) -> int:
    c.job(a.job)
    pods = [p for p in c.pods(a.job, a.role) if a.pod is None or p.metadata.name == a.pod]
    if not pods:
        raise PluginError(f"{a.job} has no {a.role} pod{' named ' + a.pod if a.pod else ''} in namespace {c.namespace}")
    if a.follow and len(pods) > 1:
        raise PluginError(f"--follow reads one pod; {a.job} has {len(pods)} {a.role} pods: choose one with --pod "
                          + ", ".join(p.metadata.name for p in pods))
    for p in pods:
        container = p.spec.containers[0].name
        if a.follow:
            for chunk in c.log(p.metadata.name, container, a.tail, True).stream():
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            continue
        text = c.log(p.metadata.name, container, a.tail, False)
        for line in (text or "").splitlines():
            print(f"[{p.metadata.name}] {line}" if len(pods) > 1 else line)
    return 0


def _curve(c: Client, a: argparse.Namespace) -> int:
    progress = c.progress(a.job)
    if progress is None or not progress.reward_curve:
        raise PluginError(f"{a.job} has no reward curve yet (no step has completed)")
    from rft_runtime.local.report import plot_reward_curve

    rows = [{"step": p.step, "reward_mean": p.mean} for p in progress.reward_curve]
    out = plot_reward_curve(rows, a.output, title=f"{c.namespace}/{a.job}")
    print(f"wrote {out} ({len(rows)} steps)")
    return 0


def _samples(c: Client, a: argparse.Namespace) -> int:
    from rft_runtime.samples_view import SamplesError, format_step, parse_steps, pick_step

    text = c.samples(a.job)
    if text is None:
        c.job(a.job)
        raise PluginError(f"{a.job} has no samples yet: the trainer writes them at its first step and every "
                          "spec.tracking.samples.everySteps steps (0 writes none)")
    where = f"ConfigMap {a.job}-progress"
    try:
        steps = parse_steps(text)
        entry = pick_step(steps, a.step, where)
    except SamplesError as e:
        raise PluginError(str(e)) from None
    if a.output == "json":
        print(json.dumps(entry, ensure_ascii=False, indent=1))
    else:
        print(format_step(entry, steps=[s["step"] for s in steps]))
    return 0


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="kubectl rft", description="Inspect and control RFTJobs.")
    ap.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
    ap.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_ in (("status", "phase, progress, reward trend, checkpoint"), ("suspend", "set spec.suspend"),
                        ("resume", "clear spec.suspend")):
        sub.add_parser(name, help=help_).add_argument("job")
    lg = sub.add_parser("logs", help="logs of the job's pods in one role")
    lg.add_argument("job")
    lg.add_argument("--role", required=True, choices=ROLES)
    lg.add_argument("--pod", default=None, help="only this pod of the role")
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("--tail", type=int, default=None, help="lines from the end of each pod's log")
    cv = sub.add_parser("curve", help="write the reward curve as a PNG")
    cv.add_argument("job")
    cv.add_argument("-o", "--output", required=True, type=Path)
    sm = sub.add_parser("samples", help="the newest sampled completions, their rewards and reasons")
    sm.add_argument("job")
    sm.add_argument("--step", type=int, default=None, help="this step (one of those kept; default: the newest)")
    sm.add_argument("-o", "--output", choices=("text", "json"), default="text")
    ex = sub.add_parser("export", help="copy the trained model out of the job's claim")
    ex.add_argument("job")
    ex.add_argument("dir", type=Path, help="where to write it (created; must be empty)")
    ex.add_argument("--merged", action="store_true", help="the merged copy of a LoRA adapter")
    ex.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the export pod to start")
    ex.add_argument("--image", default=None, help="the export pod's image (default: spec.runtimeImage, else the "
                                                   "image of the job's trainer pods)")
    return ap.parse_args(argv)


COMMANDS = {"status": _status, "suspend": _suspend, "resume": _suspend, "logs": _logs, "curve": _curve,
            "export": _export, "samples": _samples}


def main(argv: Optional[list[str]] = None) -> int:
    """Console script ``kubectl-rft``."""
    a = parse_args(argv)
    try:
        return COMMANDS[a.command](Client(a.kubeconfig, a.namespace), a)
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
