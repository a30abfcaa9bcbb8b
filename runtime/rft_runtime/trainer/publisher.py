"""Publishing new weights to inference (DESIGN.md contract 2, weight reload).

:meth:`WeightPublisher.publish` saves the policy to ``<checkpoints>/weights/v<version>`` —
safetensors of the whole model, or of the LoRA adapter only — written to a temporary directory
and renamed, then POSTs ``/update_weights_from_disk {"model_path", "policy_version"}`` (SGLang's
route, served by our builtin server) to every inference endpoint, and verifies with
``GET /get_policy_version`` that each server reports the new version. Failures are retried with
backoff (425/429/5xx, connection errors) until a deadline; a server that refuses the weights
(4xx) fails the publication with its message. Old weight directories are pruned (the newest
``keep`` stay).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import httpx

from .checkpoint import fsync_tree

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"^v(\d+)$")


class PublishError(RuntimeError):
    """Inference did not take the new weights; the message names the server and its answer."""


def save_policy_weights(model: Any, out_dir: Path, tokenizer: Any = None) -> str:
    """Save ``model`` for inference into ``out_dir``: the adapter for a peft model (returns
    ``"lora"``), else the full model in Hugging Face format (returns ``"full"``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    is_peft = hasattr(model, "peft_config")
    model.save_pretrained(out_dir, safe_serialization=True)
    if not is_peft and tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return "lora" if is_peft else "full"


class WeightPublisher:
    """Saves weights and makes every inference endpoint load them."""

    def __init__(self, root: str | Path, endpoints: Sequence[str], *, keep: int = 2,
                 deadline_s: float = 600.0, attempt_timeout_s: float = 300.0) -> None:
        self.root = Path(root)
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.keep = max(1, keep)
        self.deadline_s = deadline_s
        self.attempt_timeout_s = attempt_timeout_s
        self._rng = random.Random()

    def weights_dir(self, version: int) -> Path:
        return self.root / f"v{version}"

    def save(self, model: Any, version: int, tokenizer: Any = None) -> Path:
        """Write the weights of ``version`` atomically; returns their directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.weights_dir(version)
        tmp = self.root / f".tmp-v{version}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        save_policy_weights(model, tmp, tokenizer)
        fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        return final

    def publish(self, model: Any, version: int, tokenizer: Any = None) -> Path:
        """Save and load ``version`` into every endpoint; verify each reports it."""
        path = self.save(model, version, tokenizer)
        self.load(path, version)
        self.prune(version)
        return path

    def load(self, path: Path, version: int) -> None:
        """POST the reload to every endpoint and verify the reported policy version."""
        for url in self.endpoints:
            self.load_endpoint(url, path, version)

    def load_endpoint(self, url: str, path: Path, version: int) -> None:
        """POST the reload to one endpoint and verify the policy version it reports."""
        url = url.rstrip("/")
        with httpx.Client(timeout=self.attempt_timeout_s) as http:
            body = self._post(http, url + "/update_weights_from_disk",
                              {"model_path": str(path), "policy_version": version})
            if not body.get("success", False):
                raise PublishError(f"{url}: update_weights_from_disk refused {path}: {body.get('message')}")
            reported = self._get(http, url + "/get_policy_version").get("policy_version")
            if reported != version:
                raise PublishError(f"{url}: reports policy version {reported} after loading version {version}")

    def current_versions(self) -> dict[str, int | None]:
        """The policy version each endpoint reports (None when unreachable)."""
        out: dict[str, int | None] = {}
        with httpx.Client(timeout=10.0) as http:
            for url in self.endpoints:
                try:
                    out[url] = http.get(url + "/get_policy_version").json().get("policy_version")
                except (httpx.HTTPError, ValueError):
                    out[url] = None
        return out

    def prune(self, current: int) -> None:
        """Delete weight directories older than the newest ``keep``."""
        if not self.root.is_dir():
            return
        versions = sorted(int(m.group(1)) for d in self.root.iterdir() if (m := _VERSION_DIR.match(d.name)))
        for v in versions[: max(len(versions) - self.keep, 0)]:
            if v != current:
                shutil.rmtree(self.weights_dir(v), ignore_errors=True)

    def _post(self, http: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request(http, "POST", url, body)

    def _get(self, http: httpx.Client, url: str) -> dict[str, Any]:
        return self._request(http, "GET", url, None)

    def _request(self, http: httpx.Client, method: str, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        deadline = time.monotonic() + self.deadline_s
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = http.request(method, url, json=body)
                if resp.status_code == 200:
                    return resp.json()
                if resp.status_code not in (425, 429) and resp.status_code < 500:
                    try:
                        msg = resp.json().get("message") or resp.text
                    except ValueError:
                        msg = resp.text
                    raise PublishError(f"{method} {url}: HTTP {resp.status_code}: {msg}")
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            delay = min(8.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + 0.5 * self._rng.random())
            if time.monotonic() + delay > deadline:
                raise PublishError(f"{method} {url} failed after {attempt} attempts: {last}")
            log.warning("%s %s: %s; retrying in %.1fs", method, url, last, delay)
            time.sleep(delay)
