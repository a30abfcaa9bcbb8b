"""How an inference engine takes a published policy version: one class per reload protocol.

- :class:`DiskReload` — ``POST /update_weights_from_disk {"model_path", "policy_version"}`` and
  ``GET /get_policy_version`` (our builtin server; the route name is SGLang's). The engine keeps one model name
  and reports the version it serves.
- :class:`ArchiveReload` — the same, with the weights uploaded as a tar archive
  (``POST /update_weights_from_archive?policy_version=N``) for a server that does not share the
  trainer's filesystem.
- :class:`AdapterReload` — runtime LoRA loading (vLLM with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``):
  ``POST /v1/load_lora_adapter {"lora_name": "<served>-v<version>", "lora_path", "load_inplace": true}``,
  ``GET /v1/models`` lists the adapters served, ``POST /v1/unload_lora_adapter`` retires old ones.
  ``load_inplace`` makes a re-publication of a version (a trainer that resumed from an earlier
  checkpoint trains that version again) replace the adapter of the same name instead of being
  refused. Naming is :mod:`rft_runtime.adapters`.

:func:`reload_protocol` picks the protocol for ``spec.inference``. A protocol issues requests only
through the publisher's ``call``, which retries 425/429/5xx and connection errors until a deadline
and raises :class:`PublishError` on any other status not listed in ``accept``.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any, Callable, Protocol

import httpx

from ..adapters import adapter_name, adapter_version, serves_adapters


class PublishError(RuntimeError):
    """Inference did not take the new weights; the message names the server and its answer."""


NO_VERSION = -1
"""What :meth:`ReloadProtocol.reported_version` returns for an engine that serves no policy version
yet (an adapter engine with no adapter loaded): never equal to a real version, so it gets one."""

Call = Callable[..., httpx.Response]
"""``call(method, url, body=None, accept=(200,)) -> Response`` with the publisher's retries."""


class ReloadProtocol(Protocol):
    """Load a version into one endpoint, read back what it serves, retire what it no longer needs."""

    serves_several: bool
    """Whether the engine serves several versions side by side (each by its own name)."""

    def load(self, call: Call, url: str, path: str, version: int) -> None: ...

    def reported_version(self, call: Call, url: str) -> int: ...

    def retire(self, call: Call, url: str, keep: set[int]) -> list[int]: ...


def _json(resp: httpx.Response, what: str) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise PublishError(f"{what}: answer is not JSON: {resp.text[:300]!r}") from None


class DiskReload:
    """``/update_weights_from_disk`` + ``/get_policy_version`` (the builtin server)."""

    serves_several = False

    def load(self, call: Call, url: str, path: str, version: int) -> None:
        body = _json(call("POST", url + "/update_weights_from_disk",
                          {"model_path": path, "policy_version": version}), url)
        if not body.get("success", False):
            raise PublishError(f"{url}: update_weights_from_disk refused {path}: {body.get('message')}")

    def reported_version(self, call: Call, url: str) -> int:
        v = _json(call("GET", url + "/get_policy_version"), url).get("policy_version")
        if isinstance(v, bool) or not isinstance(v, int):
            raise PublishError(f"{url}: /get_policy_version answered policy_version={v!r}")
        return v

    def retire(self, call: Call, url: str, keep: set[int]) -> list[int]:
        return []  # one model, replaced in place


class ArchiveReload(DiskReload):
    """``/update_weights_from_archive?policy_version=N`` with the weights directory as a tar body, then
    ``/get_policy_version``: the builtin server on a machine that does not share the trainer's
    filesystem (``trainer.weightTransfer: http``; ``rft run`` on a Ray cluster). The archive of a
    version is built once and sent to every replica."""

    def __init__(self) -> None:
        self._archive: tuple[str, bytes] | None = None

    def archive(self, path: str) -> bytes:
        if self._archive is None or self._archive[0] != path:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(path, arcname=Path(path).name)
            self._archive = (path, buf.getvalue())
        return self._archive[1]

    def load(self, call: Call, url: str, path: str, version: int) -> None:
        body = _json(call("POST", f"{url}/update_weights_from_archive?policy_version={version}", self.archive(path)),
                     url)
        if not body.get("success", False):
            raise PublishError(f"{url}: update_weights_from_archive refused policy version {version}: "
                               f"{body.get('message')}")


class AdapterReload:
    """Each version a named LoRA adapter (vLLM runtime LoRA updating)."""

    serves_several = True

    def __init__(self, served_model: str, *, load_route: str = "/v1/load_lora_adapter",
                 unload_route: str = "/v1/unload_lora_adapter", models_route: str = "/v1/models") -> None:
        self.served_model = served_model
        self.load_route, self.unload_route, self.models_route = load_route, unload_route, models_route

    def load(self, call: Call, url: str, path: str, version: int) -> None:
        call("POST", url + self.load_route,
             {"lora_name": adapter_name(self.served_model, version), "lora_path": path, "load_inplace": True})

    def served_versions(self, call: Call, url: str) -> list[int]:
        """The versions whose adapters ``url`` serves, ascending."""
        data = _json(call("GET", url + self.models_route), url).get("data")
        if not isinstance(data, list):
            raise PublishError(f"{url}{self.models_route}: no 'data' list in the answer")
        found = (adapter_version(self.served_model, m.get("id")) for m in data if isinstance(m, dict))
        return sorted(v for v in found if v is not None)

    def reported_version(self, call: Call, url: str) -> int:
        versions = self.served_versions(call, url)
        return versions[-1] if versions else NO_VERSION

    def retire(self, call: Call, url: str, keep: set[int]) -> list[int]:
        """Unload every adapter of this model whose version is not in ``keep`` (older ones, and newer
        ones left by a trainer that since resumed from an earlier checkpoint)."""
        gone = [v for v in self.served_versions(call, url) if v not in keep]
        for v in gone:
            # 404: already gone (another publisher, a restart) — the goal is reached either way
            call("POST", url + self.unload_route, {"lora_name": adapter_name(self.served_model, v)},
                 accept=(200, 404))
        return gone


def reload_protocol(engine: str, weight_sync: str, served_model: str, transfer: str = "path") -> ReloadProtocol:
    """The protocol for ``spec.inference.engine`` / ``weightSync`` serving ``served_model``;
    ``transfer`` (the runtime config's ``trainer.weightTransfer``): ``http`` uploads the weights."""
    if serves_adapters(engine, weight_sync):
        if transfer == "http":
            raise PublishError(f"trainer.weightTransfer: http uploads whole weights to the builtin server; the "
                               f"{engine} engine with weightSync {weight_sync!r} loads adapters from a shared path")
        return AdapterReload(served_model)
    return ArchiveReload() if transfer == "http" else DiskReload()
