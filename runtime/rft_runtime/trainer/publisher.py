"""Publishing new weights to inference (contract 2 in docs/architecture.md, weight reload).

:meth:`WeightPublisher.publish` saves the policy to ``<checkpoints>/weights/v<version>`` —
safetensors of the whole model, or of the LoRA adapter only — written to a temporary directory
and renamed, then makes every inference replica (:class:`.replicas.InferenceReplicas`: each ready
pod of the inference Deployment) load it through the engine's reload protocol (:mod:`.reload`:
``/update_weights_from_disk`` for the builtin server, a named LoRA adapter per version for vLLM), and
verifies that each reports the new version; only then is ``current.json`` (the version a replica
that starts loads, :data:`rft_api.layout.CURRENT_WEIGHTS_FILE`) pointed at it, and only then does the
trainer grant the version to rollouts. Failures are retried with backoff (425/429/5xx, connection
errors) until a deadline; a replica that stops answering and is no longer listed (its pod deleted,
or no longer Ready) is skipped; a server that refuses the weights (4xx) fails the publication with
its message. Only the newest ``keep`` versions stay: older weight directories are pruned, and an
adapter engine unloads their adapters (``keep`` covers the versions that bounded-staleness rollouts
may still request).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

from rft_api.layout import CURRENT_WEIGHTS_FILE

from .. import auth
from ..timeouts import client_timeout, tls_context
from .checkpoint import fsync_tree, write_text_atomic
from .reload import DiskReload, PublishError, ReloadProtocol
from .replicas import InferenceReplicas

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"^v(\d+)$")


class ReplicaGone(PublishError):
    """A replica stopped answering and is no longer listed among the replicas."""


def save_policy_weights(model: Any, out_dir: Path, tokenizer: Any = None,
                        state_dict: dict[str, Any] | None = None) -> str:
    """Save ``model`` for inference into ``out_dir``: the adapter for a peft model (returns
    ``"lora"``), else the full model in Hugging Face format (returns ``"full"``). ``state_dict``:
    the weights to write (a sharded trainer's gathered full state dict) instead of ``model``'s own."""
    out_dir.mkdir(parents=True, exist_ok=True)
    is_peft = hasattr(model, "peft_config")
    if state_dict is None:
        model.save_pretrained(out_dir, safe_serialization=True)
    else:
        model.save_pretrained(out_dir, safe_serialization=True, state_dict=state_dict)
    if not is_peft and tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return "lora" if is_peft else "full"


class WeightPublisher:
    """Saves weights and makes every inference endpoint load them."""

    def __init__(self, root: str | Path, endpoints: Sequence[str] | InferenceReplicas, *, keep: int = 2,
                 deadline_s: float = 600.0, attempt_timeout_s: float = 300.0,
                 protocol: ReloadProtocol | None = None) -> None:
        self.root = Path(root)
        self.protocol: ReloadProtocol = protocol or DiskReload()
        self.replicas = endpoints if isinstance(endpoints, InferenceReplicas) else InferenceReplicas(endpoints)
        self.keep = max(1, keep)
        self.deadline_s = deadline_s
        self.attempt_timeout_s = attempt_timeout_s
        self._rng = random.Random()

    def weights_dir(self, version: int) -> Path:
        return self.root / f"v{version}"

    def save(self, model: Any, version: int, tokenizer: Any = None, state_dict: dict[str, Any] | None = None) -> Path:
        """Write the weights of ``version`` atomically; returns their directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.weights_dir(version)
        tmp = self.root / f".tmp-v{version}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        save_policy_weights(model, tmp, tokenizer, state_dict)
        fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        return final

    def publish(self, model: Any, version: int, tokenizer: Any = None,
                state_dict: dict[str, Any] | None = None) -> Path:
        """Save and load ``version`` into every endpoint; verify each reports it."""
        path = self.save(model, version, tokenizer, state_dict)
        self.load(path, version)
        self.prune(version)
        return path

    @property
    def endpoints(self) -> list[str]:
        """The inference replicas as of now, without waiting (none while discovery lists none,
        :meth:`.InferenceReplicas.urls`)."""
        return self.replicas.urls()

    def load(self, path: Path, version: int) -> list[str]:
        """Load ``version`` into every replica and verify the policy version each reports (a replica
        that went away meanwhile is skipped), then point ``current.json`` at it. Returns the replicas
        that serve it."""
        served = []
        for url in self.replicas.urls(wait=True):
            try:
                self.load_endpoint(url, path, version)
            except ReplicaGone as e:
                log.warning("policy version %d not loaded into %s: %s", version, url, e)
                continue
            served.append(url)
        self.write_current(version, path)
        log.info("policy version %d served by %d inference replica(s): %s", version, len(served), ", ".join(served))
        return served

    def write_current(self, version: int, path: Path) -> None:
        """Point ``current.json`` at ``version`` (atomically), for replicas that start later."""
        write_text_atomic(self.root / CURRENT_WEIGHTS_FILE, json.dumps({"policy_version": version, "path": path.name}))

    def load_endpoint(self, url: str, path: Path, version: int) -> None:
        """Retire the versions no longer kept once ``version`` is published, load ``version`` into one
        endpoint, and verify the policy version it reports. Retiring first keeps at most ``keep``
        versions served at any moment (vLLM's ``--max-loras`` slots: a third adapter would evict one in
        use); the one retired is older than every version a task may still be granted. :class:`ReplicaGone`
        when it stops answering and is no longer listed."""
        url = url.rstrip("/")
        with httpx.Client(timeout=client_timeout(self.attempt_timeout_s), headers=auth.client_headers(),
                          verify=tls_context()) as http:
            call = self._caller(http, present=lambda: self.replicas.present(url))
            retired = self.protocol.retire(call, url, self.kept_versions(version))
            if retired:
                log.info("%s: retired policy versions %s", url, retired)
            self.protocol.load(call, url, str(path), version)
            reported = self.protocol.reported_version(call, url)
            if reported != version:
                raise PublishError(f"{url}: reports policy version {reported} after loading version {version}")

    def restore_endpoint(self, url: str, current: int) -> list[int]:
        """Bring an endpoint that lost its weights (restarted) back to ``current``: the older versions the
        protocol serves side by side (:attr:`.reload.ReloadProtocol.serves_several`; bounded-staleness
        rollouts may request them) that are still on disk, then ``current``. Returns the versions loaded."""
        older = []
        if self.protocol.serves_several:
            older = sorted(v for v in self.kept_versions(current) - {current} if self.weights_dir(v).is_dir())
        with httpx.Client(timeout=client_timeout(self.attempt_timeout_s), headers=auth.client_headers(),
                          verify=tls_context()) as http:
            for v in older:
                self.protocol.load(self._caller(http), url.rstrip("/"), str(self.weights_dir(v)), v)
        self.load_endpoint(url, self.weights_dir(current), current)
        return [*older, current]

    def kept_versions(self, current: int) -> set[int]:
        """The versions inference keeps serving once ``current`` is published: the newest ``keep``."""
        return set(range(max(0, current - self.keep + 1), current + 1))

    def current_versions(self) -> dict[str, int | None]:
        """The policy version each endpoint reports (None when unreachable; :data:`.reload.NO_VERSION`
        when it serves none)."""
        out: dict[str, int | None] = {}
        with httpx.Client(timeout=client_timeout(10.0), headers=auth.client_headers(),
                          verify=tls_context()) as http:
            call = self._caller(http, deadline_s=0.0)
            for url in self.endpoints:
                try:
                    out[url] = self.protocol.reported_version(call, url)
                except (PublishError, httpx.HTTPError, ValueError):
                    out[url] = None
        return out

    def prune(self, current: int) -> None:
        """Delete the weight directories of versions no longer kept (older than the newest ``keep``,
        and any newer than ``current`` left by a run that since resumed from an earlier checkpoint)."""
        if not self.root.is_dir():
            return
        kept = self.kept_versions(current)
        for d in self.root.iterdir():
            if (m := _VERSION_DIR.match(d.name)) and int(m.group(1)) not in kept:
                shutil.rmtree(d, ignore_errors=True)

    def _caller(self, http: httpx.Client, deadline_s: float | None = None,
                present: Callable[[], bool] | None = None) -> Callable[..., httpx.Response]:
        """``call(method, url, body=None, accept=(200,))`` for a protocol, retrying on ``http``;
        ``present``: whether the replica is still listed (asked when it does not answer)."""
        def call(method: str, url: str, body: dict[str, Any] | bytes | None = None,
                 accept: tuple[int, ...] = (200,)) -> httpx.Response:
            return self._request(http, method, url, body, accept,
                                 self.deadline_s if deadline_s is None else deadline_s, present)
        return call

    def _request(self, http: httpx.Client, method: str, url: str, body: dict[str, Any] | bytes | None,
                 accept: tuple[int, ...], deadline_s: float,
                 present: Callable[[], bool] | None = None) -> httpx.Response:
        deadline = time.monotonic() + deadline_s
        attempt = 0
        while True:
            attempt += 1
            try:
                if isinstance(body, bytes):  # an archive (ArchiveReload)
                    resp = http.request(method, url, content=body, headers={"content-type": "application/x-tar"})
                else:
                    resp = http.request(method, url, json=body)
                if resp.status_code in accept:
                    return resp
                if resp.status_code not in (425, 429) and resp.status_code < 500:
                    raise PublishError(f"{method} {url}: HTTP {resp.status_code}: {_message(resp)}")
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            except httpx.TransportError as e:
                if deadline_s <= 0:
                    raise
                last = f"{type(e).__name__}: {e}"
                if present is not None and not present():
                    raise ReplicaGone(f"{method} {url}: {last}, and it is no longer an inference replica") from e
            delay = min(8.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + 0.5 * self._rng.random())
            if time.monotonic() + delay > deadline:
                raise PublishError(f"{method} {url} failed after {attempt} attempts: {last}")
            log.warning("%s %s: %s; retrying in %.1fs", method, url, last, delay)
            time.sleep(delay)


def _message(resp: httpx.Response) -> str:
    """The error message of a vLLM/OpenAI (``{"error": {"message"}}``) or plain ``{"message"}`` body."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if data.get("message"):
            return str(data["message"])
    return resp.text[:500]


def detached_state(state: dict[str, Any], model: Any) -> dict[str, Any]:
    """``state`` (a state dict of ``model``) safe from later in-place updates of ``model``: the tensors that
    are views of its trainable parameters or its buffers (a plain module's state dict) copied, tensors that
    shared one storage (tied weights) sharing their copy too; frozen parameters (a LoRA policy's base
    model), tensors already apart (gathered from shards, moved off the device) and other values kept as
    they are, so nothing is copied that no update changes, nor twice."""
    import torch  # not at import: the driver of `rft run` reaches this module and never needs torch

    changing = itertools.chain((p for p in model.parameters() if p.requires_grad), model.buffers())
    live = {getattr(t, "_local_tensor", t).untyped_storage().data_ptr() for t in changing}
    out: dict[str, Any] = {}
    copies: dict[tuple[int, Any, tuple[int, ...], tuple[int, ...]], Any] = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in live:
            t = value.detach()
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
            if key not in copies:
                copies[key] = t.clone()
            value = copies[key]
        out[name] = value
    return out


class BackgroundPublication:
    """At most one publication at a time, run in a thread of its own while the trainer goes on.

    :meth:`start` runs ``fn(*args)`` in the thread (after the previous one ended: call :meth:`wait`
    first); :meth:`wait` blocks until it ends and returns the seconds it ran, re-raising its error."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._running: Future[float] | None = None

    @property
    def running(self) -> bool:
        """Whether a publication was started and not yet waited for."""
        return self._running is not None

    def start(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._running is not None:
            raise RuntimeError("a publication is still running: wait() for it first")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")

        def timed() -> float:
            t0 = time.perf_counter()
            fn(*args)
            return time.perf_counter() - t0

        self._running = self._pool.submit(timed)

    def wait(self) -> float | None:
        """The seconds the running publication took (None when none was running); its error, raised."""
        running, self._running = self._running, None
        return None if running is None else running.result()

    def close(self) -> None:
        """Wait for a running publication, logging (not raising) its error, and end the thread."""
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 - closing after a failure: the first error is already being raised
            log.warning("the publication running in the background failed: %s", e)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


FINAL_DIR = "final"
MERGED_DIR = "merged"


def export_final_model(model: Any, root: Path, tokenizer: Any = None, state_dict: dict[str, Any] | None = None,
                       *, base_model_dir: str | Path | None = None, merge_adapter: bool = False) -> tuple[str, str | None]:
    """Write the trained policy to ``root/final`` (atomically: a temporary directory renamed into
    place) so that it outlives the job: the full model in Hugging Face layout with the tokenizer, or,
    for a LoRA policy, the adapter with the tokenizer and, when ``merge_adapter``, a merged full copy
    (the adapter applied to ``base_model_dir``) under ``final/merged``. Returns ``(format, merged
    path or None)``, paths relative to ``root``."""
    root = Path(root)
    final, tmp = root / FINAL_DIR, root / f".tmp-{FINAL_DIR}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    fmt = save_policy_weights(model, tmp, tokenizer, state_dict)
    merged = None
    if fmt == "lora":
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if merge_adapter:
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_pretrained(str(base_model_dir))
            full = PeftModel.from_pretrained(base, str(tmp)).merge_and_unload()
            full.save_pretrained(tmp / MERGED_DIR, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp / MERGED_DIR)
            merged = f"{FINAL_DIR}/{MERGED_DIR}"
    fsync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return fmt, merged
