"""Files of ``rft run --address`` on a Ray cluster whose nodes share no filesystem.

On one machine every role reads the driver's paths. On a cluster a role may run on another node, so
nothing travels by path:

- **Inputs.** The driver packs every input path it has (the model directory, a separate tokenizer,
  warm-start weights, the chat template, the dataset and evaluator files placed from the manifest's
  ConfigMaps, and a resumed run's checkpoints and metrics) into a tar archive in Ray's object store,
  once (:func:`ship`), streamed in pieces of :data:`PIECE_BYTES`: neither the driver nor a node ever
  holds a whole archive in memory, only the object store does (which spills to disk). Each role
  unpacks what it reads into a directory on its own node — shared by the actors of one node, keyed
  by the archive's digest — and runs with its config's paths rewritten to those copies
  (:meth:`Stage.localize`). Rollout workers get the model directory without its weight files (they
  need the tokenizer only). A path the driver does not have is left as written: a volume mounted at
  the same path on every node.
- **Outputs.** The trainer writes checkpoints, metrics, TensorBoard events, progress and the final
  model into a work directory on its node; after every step the driver copies what changed into
  ``--out`` and removes what the trainer removed (pruned checkpoints) (:class:`OutputSync`), so a
  checkpoint the trainer committed is on the driver's machine before the next step starts, and
  ``--resume`` works from ``--out`` alone.
- **Weights.** The trainer uploads each policy version to every inference replica over HTTP
  (``trainer.weightTransfer: http``, :class:`~rft_runtime.trainer.reload.ArchiveReload`).
- **Logs.** Each actor logs into its work directory; the driver copies them into ``<out>/logs`` at
  the end of the run, a failed one included.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rft_api import runtime

STAGE_ENV = "RFT_STAGE_DIR"
"""Where a node keeps its copies and work directories (default: the system's temporary directory)."""

PIECE_ENV = "RFT_STAGE_PIECE_BYTES"
"""The driver's size of the pieces an input archive is put into the object store in (default
:data:`PIECE_BYTES`)."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
"""Files left out of the model directory a rollout worker gets (it reads the tokenizer only)."""

TRAINER_OUTPUTS = ("checkpoints", "metrics.jsonl", "tensorboard", "progress.json")
"""What the trainer writes under its work directory that the driver keeps in ``--out``."""

SKIPPED_OUTPUTS = ("checkpoints/weights",)
"""Trainer outputs that are not copied back: the published policy versions (inference's copies)."""

PIECE_BYTES = 64 << 20
"""The largest piece of an input archive in the object store: the driver and each node hold one piece
at a time, never the whole archive (a model's weights are many gigabytes)."""


class _Pieces(io.RawIOBase):
    """A write-only stream that hands every ``size`` bytes written to ``put`` (and the rest at
    :meth:`finish`), hashing them on the way."""

    def __init__(self, put: Callable[[bytes], Any], size: int) -> None:
        super().__init__()
        self.put, self.size = put, max(1, size)
        self.buf = bytearray()
        self.pieces: list[Any] = []
        self.sha = hashlib.sha256()
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        self.sha.update(b)
        self.total += n
        self.buf += b
        while len(self.buf) >= self.size:
            self.pieces.append(self.put(bytes(self.buf[:self.size])))
            del self.buf[:self.size]
        return n

    def finish(self) -> tuple[str, tuple[Any, ...], int]:
        """The archive's digest, its pieces as ``put`` returned them, and its size in bytes."""
        if self.buf or not self.pieces:
            self.pieces.append(self.put(bytes(self.buf)))
            self.buf.clear()
        return self.sha.hexdigest()[:32], tuple(self.pieces), self.total


class _Joined(io.RawIOBase):
    """A read-only stream over ``pieces`` (bytes), fetched one at a time as reading reaches them."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        super().__init__()
        self.pieces = iter(pieces)
        self.cur, self.pos = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self.pos >= len(self.cur):
            nxt = next(self.pieces, None)
            if nxt is None:
                return 0
            self.cur, self.pos = nxt, 0
        n = min(len(b), len(self.cur) - self.pos)
        b[:n] = self.cur[self.pos:self.pos + n]
        self.pos += n
        return n


def _weights_filter(m: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if m.isfile() and m.name.endswith(WEIGHT_SUFFIXES) else m


def pack_pieces(add: Callable[[tarfile.TarFile], None], put: Callable[[bytes], Any], *,
                piece_bytes: int = PIECE_BYTES) -> tuple[str, tuple[Any, ...], int]:
    """An uncompressed tar archive of what ``add`` adds to it, written as a stream and handed to
    ``put`` in pieces of ``piece_bytes``: its digest, what ``put`` returned for each piece, and its
    size."""
    sink = _Pieces(put, piece_bytes)
    with tarfile.open(fileobj=sink, mode="w|") as tar:
        add(tar)
    return sink.finish()


def _adder(path: Path, skip_weights: bool) -> Callable[[tarfile.TarFile], None]:
    """Adds ``path`` (a file or a directory) as the archive's one top entry, its name."""
    return lambda tar: tar.add(str(path), arcname=path.name, filter=_weights_filter if skip_weights else None)


def pack(path: Path, *, skip_weights: bool = False) -> bytes:
    """``path`` (a file or a directory) as an uncompressed tar archive whose one top entry is its name."""
    return b"".join(pack_pieces(_adder(path, skip_weights), lambda piece: piece)[1])


def unpack_pieces(pieces: Iterable[bytes], dest: Path) -> None:
    """Extract an archive given as consecutive pieces into ``dest``, reading them as a stream (one
    piece in memory at a time), with Python's ``data`` filter: no absolute paths, no links out of
    ``dest``, no devices."""
    with tarfile.open(fileobj=_Joined(pieces), mode="r|") as tar:
        tar.extractall(dest, filter="data")


def unpack(data: bytes, dest: Path) -> None:
    """Extract an archive of :func:`pack` into ``dest`` (see :func:`unpack_pieces`)."""
    unpack_pieces([data], dest)


@dataclass(frozen=True)
class Archive:
    """One input path in the object store."""

    name: str
    """The path's last component (the archive's top entry)."""
    digest: str
    refs: tuple[Any, ...]
    """The ``ray.ObjectRef`` of each piece of the archive's bytes, in order (:data:`PIECE_BYTES`)."""
    size: int = 0
    """The archive's bytes."""


@dataclass
class Shipment:
    """The inputs of one run, by the path the driver's config names them with."""

    run_id: str
    piece_bytes: int = PIECE_BYTES
    full: dict[str, Archive] = field(default_factory=dict)
    light: dict[str, Archive] = field(default_factory=dict)
    """Directories without their weight files (what a rollout worker gets for the model)."""
    outputs: Archive | None = None
    """A resumed run's trainer outputs (``TRAINER_OUTPUTS`` of ``--out``), for the trainer's work dir."""

    def summary(self) -> str:
        """How much went into the object store, in how many archives and pieces."""
        archives = [*self.full.values(), *self.light.values(), *([self.outputs] if self.outputs else [])]
        size = sum(a.size for a in archives)
        return (f"{len(archives)} archive(s), {size / 2**20:.1f} MiB in {sum(len(a.refs) for a in archives)} "
                f"piece(s) of at most {self.piece_bytes / 2**20:g} MiB")


def driver_paths(shipment: Shipment, text: str) -> str:
    """``text`` (a role's error message) with the paths of a node's copies replaced by the driver's
    paths they were made from: the user sees the files they gave."""
    parents = {a.digest: str(Path(p).parent) for archives in (shipment.full, shipment.light) for p, a in archives.items()}
    pattern = re.compile(rf"[^\s'\"]*/rft-run-{re.escape(shipment.run_id)}/inputs/([0-9a-f]{{32}})(?=/)")
    return pattern.sub(lambda m: parents.get(m.group(1), m.group(0)), text)


def _put(path: Path, *, skip_weights: bool = False, piece_bytes: int = PIECE_BYTES) -> Archive:
    import ray

    return Archive(path.name, *pack_pieces(_adder(path, skip_weights), ray.put, piece_bytes=piece_bytes))


def input_paths(paths: runtime.Paths) -> list[str]:
    """Every input path a config names (the model, tokenizer, warm start, chat template, dataset and
    evaluator files); builtin model names are not paths."""
    found = [paths.model, paths.tokenizer, paths.warm_start, paths.chat_template,
             paths.datasets.train, paths.datasets.eval, *paths.datasets.mix.values(),
             *(f.path for f in paths.evaluator_files)]
    return [p for p in dict.fromkeys(found) if p and not p.startswith("builtin:")]


def piece_bytes_from_env() -> int:
    """``$RFT_STAGE_PIECE_BYTES`` (:data:`PIECE_BYTES` when unset); ValueError naming it unless it is a
    positive whole number of bytes."""
    raw = os.environ.get(PIECE_ENV, "").strip()
    if not raw:
        return PIECE_BYTES
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValueError(f"${PIECE_ENV} must be a positive whole number of bytes, not {raw!r}")
    return int(raw)


def ship(paths: runtime.Paths, run_id: str, resume_from: Path | None = None, *,
         piece_bytes: int | None = None) -> Shipment:
    """Put every input path of ``paths`` that exists here into the object store, each as an archive
    in pieces of ``piece_bytes`` (default ``$RFT_STAGE_PIECE_BYTES``, else :data:`PIECE_BYTES`; see the
    module docstring); ``resume_from``: the ``--out`` of a run to resume, whose trainer outputs go too."""
    if piece_bytes is None:
        piece_bytes = piece_bytes_from_env()
    s = Shipment(run_id, piece_bytes)
    for p in input_paths(paths):
        path = Path(p)
        if not path.exists():
            continue  # a volume the nodes mount at this path
        s.full[p] = _put(path, piece_bytes=piece_bytes)
        if path.is_dir():
            s.light[p] = _put(path, skip_weights=True, piece_bytes=piece_bytes)
    if resume_from is not None:
        s.outputs = _put_outputs(resume_from, piece_bytes)
    return s


def _put_outputs(out: Path, piece_bytes: int) -> Archive:
    import ray

    def add(tar: tarfile.TarFile) -> None:
        for rel in _output_files(out):
            tar.add(str(out / rel), arcname=rel)
    return Archive("", *pack_pieces(add, ray.put, piece_bytes=piece_bytes))


def _fetch(refs: Iterable[Any]) -> Iterator[bytes]:
    """The pieces of an archive from the object store, one at a time."""
    import ray

    for ref in refs:
        yield ray.get(ref)


def node_root(run_id: str) -> Path:
    """This node's directory for the run (copies of the inputs, the actors' work directories)."""
    base = Path(os.environ.get(STAGE_ENV) or tempfile.gettempdir())
    return base / f"rft-run-{run_id}"


class Stage:
    """One actor's view of a shipment: its work directory and the inputs it has unpacked."""

    def __init__(self, shipment: Shipment, role: str) -> None:
        self.shipment = shipment
        self.root = node_root(shipment.run_id)
        self.work = self.root / "work" / role
        self.work.mkdir(parents=True, exist_ok=True)

    @property
    def log_dir(self) -> Path:
        return self.work / "logs"

    def get(self, path: str, *, light: bool = False) -> str:
        """The local copy of the driver's ``path`` (unpacked on first use; the actors of a node share
        it), or ``path`` itself when the driver did not ship it."""
        archives = self.shipment.light if light else self.shipment.full
        archive = archives.get(path) or self.shipment.full.get(path)
        if archive is None:
            return path
        dest = self.root / "inputs" / archive.digest
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
            unpack_pieces(_fetch(archive.refs), tmp)
            try:
                os.rename(tmp, dest)
            except OSError:  # another actor of this node unpacked it first
                shutil.rmtree(tmp, ignore_errors=True)
        return str(dest / archive.name)

    def localize(self, cfg: runtime.RuntimeConfig, *, tokenizer_only: bool = False,
                 outputs: bool = False) -> runtime.RuntimeConfig:
        """``cfg`` with every input path replaced by its local copy; ``tokenizer_only``: the model
        directory without its weights (a rollout worker's); ``outputs``: checkpoints and metrics in
        this actor's work directory (the trainer's), seeded with a resumed run's outputs."""
        p = cfg.paths

        def get(v: str | None, light: bool = False) -> str | None:
            return None if v is None else self.get(v, light=light)

        update: dict[str, Any] = {
            "model": self.get(p.model, light=tokenizer_only), "tokenizer": get(p.tokenizer, tokenizer_only),
            "warm_start": None if tokenizer_only else get(p.warm_start), "chat_template": get(p.chat_template),
            "datasets": p.datasets.model_copy(update={
                "train": get(p.datasets.train), "eval": get(p.datasets.eval),
                "mix": {k: self.get(v) for k, v in p.datasets.mix.items()}}),
            "evaluator_files": [f.model_copy(update={"path": self.get(f.path)}) for f in p.evaluator_files],
        }
        if outputs:
            if self.shipment.outputs is not None and not (self.work / "checkpoints").exists():
                unpack_pieces(_fetch(self.shipment.outputs.refs), self.work)
            update.update(checkpoints=str(self.work / "checkpoints"), output=str(self.work))
        return cfg.model_copy(update={"paths": p.model_copy(update=update)})

    def logs(self) -> dict[str, bytes]:
        """This actor's log files, by name."""
        if not self.log_dir.is_dir():
            return {}
        return {f.name: f.read_bytes() for f in sorted(self.log_dir.iterdir()) if f.is_file()}

    def cleanup(self) -> None:
        """Remove the run's directory on this node (copies and work directories of every actor of
        the node: called when the run ends, once its outputs and logs were copied)."""
        shutil.rmtree(self.root, ignore_errors=True)


def _skipped(rel: str) -> bool:
    return any(rel == s or rel.startswith(s + "/") for s in SKIPPED_OUTPUTS)


def _temporary(name: str) -> bool:
    """An entry being written: the trainer's ``.tmp-…`` directories and ``.<name>.tmp-…`` files, and
    this module's ``.<name>.part`` (hidden names of their own, such as a distributed checkpoint's
    ``.metadata``, are outputs)."""
    return name.startswith(".") and (".tmp" in name or name.endswith(".part"))


def _output_files(root: Path) -> list[str]:
    """The trainer outputs under ``root`` (relative paths of files), temporary entries excluded."""
    found = []
    for top in TRAINER_OUTPUTS:
        base = root / top
        if base.is_file():
            found.append(top)
        elif base.is_dir():
            for dirpath, dirnames, files in os.walk(base):
                dirnames[:] = [d for d in dirnames if not _temporary(d)]
                for f in files:
                    rel = os.path.relpath(os.path.join(dirpath, f), root)
                    if not _temporary(f) and not _skipped(rel):
                        found.append(rel)
    return sorted(found)


def changed_outputs(root: Path, known: dict[str, tuple[int, int]]) -> tuple[dict[str, bytes], list[str],
                                                                            dict[str, tuple[int, int]]]:
    """The trainer's side of :class:`OutputSync`: (contents of files new or changed since ``known``,
    paths in ``known`` that are gone, the new ``known``), each file's signature (size, mtime_ns)."""
    now: dict[str, tuple[int, int]] = {}
    changed: dict[str, bytes] = {}
    for rel in _output_files(root):
        try:
            st = (root / rel).stat()
            sig = (st.st_size, st.st_mtime_ns)
            if known.get(rel) != sig:
                changed[rel] = (root / rel).read_bytes()
        except FileNotFoundError:  # removed while we looked (a pruned checkpoint)
            continue
        now[rel] = sig
    return changed, [rel for rel in known if rel not in now], now


class OutputSync:
    """The driver's side: mirror the trainer's outputs into ``out`` (files it wrote earlier that the
    trainer removed are removed here too; nothing else in ``out`` is touched)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.known: dict[str, tuple[int, int]] = {}

    def pull(self, trainer: Any) -> int:
        """Copy what changed from the trainer actor (its ``changed_outputs`` method); returns the
        number of files written or removed."""
        import ray

        changed, gone, self.known = ray.get(trainer.changed_outputs.remote(self.known))
        self.apply(changed, gone)
        return len(changed) + len(gone)

    def apply(self, changed: dict[str, bytes], gone: Iterable[str]) -> None:
        # A checkpoint's files before the pointer that commits it: "latest" files are written last,
        # each atomically, as the trainer does.
        for rel in sorted(changed, key=lambda r: (Path(r).name == "latest", r)):
            dest = self.out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.part")
            tmp.write_bytes(changed[rel])
            os.replace(tmp, dest)
        for rel in gone:
            (self.out / rel).unlink(missing_ok=True)
        for top in TRAINER_OUTPUTS:  # directories a pruned checkpoint left empty
            base = self.out / top
            if base.is_dir():
                for dirpath, _, _ in sorted(os.walk(base), key=lambda t: -len(t[0])):
                    if dirpath != str(base) and not os.listdir(dirpath):
                        os.rmdir(dirpath)


def write_logs(out: Path, logs: dict[str, bytes]) -> None:
    """Write an actor's log files into ``<out>/logs``."""
    d = out / "logs"
    d.mkdir(parents=True, exist_ok=True)
    for name, data in logs.items():
        (d / Path(name).name).write_bytes(data)
