"""The files of a weights directory as they travel and land: an uploaded archive unpacked without
leaving its directory or the disk's budget, a safetensors index read without naming files elsewhere.
Shared by the roles that receive weights (the builtin server's ``/update_weights_from_archive`` and
``/update_weights_from_disk``, the vLLM gate), with the published version a starting replica loads
(:func:`current_published`)."""

from __future__ import annotations

import json
import logging
import os
import tarfile
from pathlib import Path

from rft_api.layout import CURRENT_WEIGHTS_FILE

log = logging.getLogger(__name__)

__all__ = ["MAX_ARCHIVE_MEMBERS", "WeightFileError", "current_published", "shard_path", "unpack_weights_archive", "weight_map"]


class WeightFileError(ValueError):
    """The directory, archive or index does not hold weights that can be loaded (the message says why)."""


MAX_ARCHIVE_MEMBERS = 4096
"""Entries a weights archive may hold (a sharded model and its config files are a few dozen)."""


def unpack_weights_archive(archive: Path, dest: Path, limit: int) -> None:
    """Unpack a weights archive, an uncompressed tar whose one top entry is a directory, into ``dest``.
    The unpacked size (what lands on the disk, not the bytes uploaded) is checked against ``limit``
    and the number of entries against :data:`MAX_ARCHIVE_MEMBERS` before anything is written: a
    compressed archive could otherwise turn a small upload into a full disk."""
    with tarfile.open(archive, mode="r:") as tar:  # "r:": no decompression
        members = []
        for m in tar:
            members.append(m)
            if len(members) > MAX_ARCHIVE_MEMBERS:
                raise WeightFileError(f"more than {MAX_ARCHIVE_MEMBERS} entries")
        unpacked = sum(m.size for m in members if m.isfile())
        if unpacked > limit:
            raise WeightFileError(f"it unpacks to {unpacked} bytes, more than the server's cap of {limit}")
        tops = {m.name.split("/", 1)[0] for m in members}
        if len(tops) != 1:
            raise WeightFileError(f"expected one top directory, found {sorted(tops)[:5]}")
        tar.extractall(dest.parent / ".unpacked", members=members, filter="data")
    os.rename(dest.parent / ".unpacked" / tops.pop(), dest)


def weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> shard file name) of a ``model.safetensors.index.json``."""
    try:
        wm = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WeightFileError(f"{index}: not a safetensors index ({type(exc).__name__}: {exc})") from None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise WeightFileError(f"{index}: weight_map must map names to file names")
    return wm


def shard_path(path: Path, name: str) -> Path:
    """The shard file ``name`` of an index, which must be a plain file name in ``path`` (no directory,
    no ``..``, no absolute path: an index never makes the server read outside the weights directory)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise WeightFileError(f"{path}: the index names shard {name[:80]!r}, which is not a file name in the "
                              "weights directory")
    return path / name


def current_published(weights_dir: str | Path) -> tuple[int, Path] | None:
    """The policy version the trainer last published to every replica and its weights directory
    (``current.json`` in ``weights_dir``, see :data:`rft_api.layout.CURRENT_WEIGHTS_FILE`); None when
    nothing usable is published yet (no file, or its directory pruned by a trainer that resumed)."""
    root = Path(weights_dir)
    try:
        data = json.loads((root / CURRENT_WEIGHTS_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s/%s is unreadable (%s): serving the initial weights", root, CURRENT_WEIGHTS_FILE, exc)
        return None
    version, rel = (data.get("policy_version"), data.get("path")) if isinstance(data, dict) else (None, None)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0 or not isinstance(rel, str) \
            or "/" in rel or rel in ("", ".", ".."):
        log.warning("%s/%s does not name a policy version and its directory: %r", root, CURRENT_WEIGHTS_FILE, data)
        return None
    path = root / rel
    if not path.is_dir():
        log.warning("policy version %d is published at %s, which is gone: serving the initial weights", version, path)
        return None
    return version, path
