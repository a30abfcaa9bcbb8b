"""Datasets as users have them: JSON Lines, JSON, Parquet and CSV files, one file or several shards, and
the split files of a downloaded Hugging Face dataset repository.

**Rows.** Every row becomes a :class:`Task` exactly as a JSONL row does (:func:`parse_jsonl_row`):
``messages`` or ``prompt``, ``ground_truth`` (required), optional ``task_id``/``id``, ``domain`` and
``metadata``; every other column is kept in ``metadata``. The default task id is ``{stem}-{row}``
(the file name without its suffix and a ``.gz``, and the row number). A task id twice (in one file or
across the files of :func:`load_files`) is an error naming both places.

**Field mapping.** A :class:`FieldMap` names the source column of each task field (GSM8K:
``FieldMap(prompt="question", ground_truth="answer")``). Each row is renamed first and validated
after: a mapped column is consumed (not kept in metadata); a mapped column missing from a row is
``<file>:<row>: field 'question' (fields.prompt) is missing``, and a null prompt or messages is
refused the same way. A column that a mapping overrides (a ``prompt`` or ``messages`` column when
either is mapped, ``task_id``/``id`` when ``task_id`` is, ``ground_truth``, ``domain``) is kept in
metadata under its own name instead of being read as that field.

**Formats** (:data:`FORMATS`, by suffix unless ``format`` is given; ``.gz`` allowed after the text
formats):

* ``jsonl`` (``.jsonl``, ``.ndjson``): one object per line, blank lines skipped; rows are file lines
  (as :func:`load_jsonl`, which gives the same tasks).
* ``json`` (``.json``): a top-level array of objects (row = 1-based index), or an object with exactly
  one member whose value is an array (``{"data": [...]}``: its elements). Any other content is read
  as JSON Lines (as the Hugging Face ``json`` loader does; row = line): a single object is one row.
* ``parquet`` (``.parquet``): read one record batch at a time; row = 1-based row of the file. Arrow
  values become plain Python: structs dicts, lists and maps lists, timestamps and dates ISO-8601
  strings, decimals strings, NaN None; binary must be UTF-8 text.
* ``csv`` (``.csv``): a header line, then one record per row; row = 1-based data record, header
  excluded, blank records skipped but counted (a quoted value may span lines, so it is not the file
  line). Every value is a string (``ground_truth`` too), except the ``messages`` and ``metadata``
  cells, which are JSON text.

In Parquet and CSV every row has every column, so a null (CSV: an empty cell) in a ``prompt``,
``messages``, ``task_id``, ``id``, ``domain`` or ``metadata`` column means that field is absent from
the row (a file may mix prompt rows and messages rows). A null ``ground_truth`` stays null.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import datetime
import decimal
import gzip
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from .jsonl import parse_jsonl_row
from .task import TOO_DEEP, DatasetError, Task

__all__ = ["FORMATS", "FieldMap", "detect_format", "load_file", "load_files", "load_split", "split_files"]

FORMATS = ("jsonl", "json", "parquet", "csv")
"""The file formats :func:`load_file` reads."""

_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_GZ_FORMATS = ("jsonl", "json", "csv")
_BATCH_ROWS = 1024
_CSV_FIELD_LIMIT = 2**31 - 1  # the csv module's default refuses cells over 128 KiB


# ---------------------------------------------------------------- field mapping


@dataclass(frozen=True)
class FieldMap:
    """Which source column holds each task field (None: the field's own name, as in JSONL).

    ``prompt`` (a string) and ``messages`` (a list of ``{role, content}``) are exclusive. There is
    deliberately no fixed system prompt here: a field map names columns only (``spec.dataset.*.fields``).
    """

    prompt: str | None = None
    messages: str | None = None
    ground_truth: str | None = None
    task_id: str | None = None
    domain: str | None = None

    def __post_init__(self) -> None:
        for key, column in self.pairs():
            if not isinstance(column, str) or not column:
                raise DatasetError(f"fields.{key}: must be a non-empty column name, got {column!r}")
        if self.prompt is not None and self.messages is not None:
            raise DatasetError("fields: prompt and messages cannot both be mapped (a task is a prompt or messages)")

    def pairs(self) -> list[tuple[str, str]]:
        """``(task field, source column)`` of each mapped field."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> "FieldMap | None":
        """A field map from a ``{field: column}`` mapping (None or empty: None); unknown fields are refused."""
        if not mapping:
            return None
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(mapping) - set(known))
        if unknown:
            raise DatasetError(f"fields: unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        return cls(**dict(mapping))


# A mapped field also claims these names: such a column is kept in metadata, not read as that field.
_CLAIMS = {"prompt": ("prompt", "messages"), "messages": ("prompt", "messages"), "task_id": ("task_id", "id"),
           "ground_truth": ("ground_truth",), "domain": ("domain",)}


def _map_row(row: Any, fields: FieldMap | None, where: str) -> Any:
    """``row`` with the mapped columns renamed to the task fields (unchanged without a mapping)."""
    pairs = fields.pairs() if fields is not None else []
    if not pairs or not isinstance(row, dict):
        return row  # parse_jsonl_row names a non-object row
    sources = {column for _, column in pairs}
    out = {k: v for k, v in row.items() if k not in sources}
    displaced = {name: out.pop(name) for key, _ in pairs for name in _CLAIMS[key] if name in out}
    for key, column in pairs:
        if column not in row:
            raise DatasetError(f"{where}: field {column!r} (fields.{key}) is missing")
        if row[column] is None and key in ("prompt", "messages"):
            raise DatasetError(f"{where}: field {column!r} (fields.{key}) is null")
        out[key] = row[column]
    if displaced:
        metadata = out.get("metadata", {})
        if isinstance(metadata, dict):  # else parse_jsonl_row refuses it
            out["metadata"] = {**displaced, **metadata}
    return out


# ---------------------------------------------------------------- formats


def _split_suffix(path: Path) -> tuple[str | None, bool]:
    """The format the file name says (None: unknown) and whether it is gzip-compressed."""
    name = path.name.lower()
    gz = name.endswith(".gz")
    if gz:
        name = name[:-3]
    fmt = _SUFFIXES.get(Path(name).suffix)
    if gz and fmt not in _GZ_FORMATS:
        return None, True
    return fmt, gz


def detect_format(path: Path) -> str:
    """The format of ``path`` by its suffix: ``.jsonl``/``.ndjson`` (jsonl), ``.json``, ``.parquet``,
    ``.csv``, and ``.gz`` after the text ones (``train.jsonl.gz``). Raises :class:`DatasetError`
    naming the file for any other name."""
    fmt, _ = _split_suffix(Path(path))
    if fmt is None:
        known = ", ".join([*_SUFFIXES, *(f"{s}.gz" for s, f in _SUFFIXES.items() if f in _GZ_FORMATS)])
        raise DatasetError(f"{path}: cannot tell the dataset format from the file name (known suffixes: {known}); "
                           f"name the format ({', '.join(FORMATS)})")
    return fmt


def _stem(path: Path) -> str:
    """The file name without ``.gz`` and its last suffix (``train.jsonl.gz`` → ``train``), as :func:`load_jsonl`."""
    return Path(path.name[:-3] if path.name.lower().endswith(".gz") else path.name).stem


def _open_text(path: Path) -> TextIO:
    """``path`` as UTF-8 text (gunzipped when it ends in ``.gz``); newlines untranslated, for csv."""
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _rows_jsonl(path: Path, where: str) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded object)`` of each non-blank line."""
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}:{lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
            except RecursionError:
                raise DatasetError(f"{where}:{lineno}: {TOO_DEEP}") from None


def _rows_json(path: Path, where: str) -> Iterator[tuple[int, Any]]:
    """The elements of a top-level array (or of an object's single array member), else JSON Lines."""
    with _open_text(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg != "Extra data":
            raise DatasetError(f"{where}: invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
        doc = None  # several values: JSON Lines
    except RecursionError:
        raise DatasetError(f"{where}: {TOO_DEEP}") from None
    del text
    if isinstance(doc, dict) and len(doc) == 1 and isinstance(next(iter(doc.values())), list):
        doc = next(iter(doc.values()))
    if isinstance(doc, list):
        yield from enumerate(doc, start=1)
    else:
        yield from _rows_jsonl(path, where)


# In a columnar file every row has every column: a null there (an empty cell in CSV) is an absent field.
_OPTIONAL_FIELDS = ("prompt", "messages", "task_id", "id", "domain", "metadata")


def _drop_absent(row: dict[str, Any], empty: str | None) -> dict[str, Any]:
    """``row`` without the task-field columns whose value is ``empty`` (None, or CSV's ``""``)."""
    return {k: v for k, v in row.items() if k not in _OPTIONAL_FIELDS or v is not empty and v != empty}


def _csv_cell(column: str, value: str, where: str) -> Any:
    """A CSV cell: a string, except ``messages`` and ``metadata`` (JSON text)."""
    if column not in ("messages", "metadata"):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: field {column!r} must be JSON in a CSV file: {e.msg}") from None
    except RecursionError:
        raise DatasetError(f"{where}: field {column!r}: {TOO_DEEP}") from None


def _rows_csv(path: Path, where: str) -> Iterator[tuple[int, Any]]:
    """``(data record number, {header: cell})``; a record with another number of cells than the header is refused."""
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    with _open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return
        if header and header[0].startswith("\ufeff"):
            header[0] = header[0][1:]
        dup = sorted({c for c in header if header.count(c) > 1})
        if dup:
            raise DatasetError(f"{where}: the header repeats column(s) {', '.join(map(repr, dup))}")
        for n, record in enumerate(reader, start=1):
            if not record:
                continue  # a blank line
            at = f"{where}:{n}"
            if len(record) != len(header):
                raise DatasetError(f"{at}: the record has {len(record)} values, the header {len(header)} columns "
                                   "(rows are data records, header excluded)")
            yield n, {c: _csv_cell(c, v, at) for c, v in _drop_absent(dict(zip(header, record)), "").items()}


def _plain(value: Any, where: str) -> Any:
    """A value from Arrow (or numpy) as plain JSON-ready Python."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise DatasetError(f"{where}: a binary value that is not UTF-8 text cannot be part of a task") from None
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _plain(value.tolist(), where)
    raise DatasetError(f"{where}: a value of type {type(value).__name__} cannot be part of a task")


def _rows_parquet(path: Path, where: str) -> Iterator[tuple[int, Any]]:
    """``(row number, row)``, one record batch in memory at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 0
    try:
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS):
            for row in batch.to_pylist():
                n += 1
                yield n, {k: _plain(v, f"{where}:{n}: field {k!r}") for k, v in _drop_absent(row, None).items()}
    except (pa.ArrowException, OSError) as e:
        at = f"{where}:{n + 1}" if n else where
        raise DatasetError(f"{at}: cannot read it as Parquet: {e}") from None


_READERS = {"jsonl": _rows_jsonl, "json": _rows_json, "parquet": _rows_parquet, "csv": _rows_csv}


# ---------------------------------------------------------------- loading


def _resolve_format(path: Path, format: str) -> str:
    if format == "auto":
        return detect_format(path)
    if format not in FORMATS:
        raise DatasetError(f"{path}: unknown dataset format {format!r}; known: auto, {', '.join(FORMATS)}")
    return format


def _iter_tasks(path: Path, format: str, fields: FieldMap | None, domain: str | None,
                where: str | None) -> Iterator[tuple[int, Task]]:
    """``(row number, task)`` of each row of one file."""
    path = Path(path)
    fmt = _resolve_format(path, format)
    label = where or str(path)
    if not path.is_file():
        raise DatasetError(f"{label}: no such file" + (" (a directory: use split_files)" if path.is_dir() else ""))
    stem = _stem(path)
    try:
        for n, row in _READERS[fmt](path, label):
            at = f"{label}:{n}"
            yield n, parse_jsonl_row(_map_row(row, fields, at), at, f"{stem}-{n}", domain)
    except UnicodeDecodeError as e:
        raise DatasetError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise DatasetError(f"{label}: not a readable gzip file ({e})") from None


def load_file(path: Path, *, format: str = "auto", fields: FieldMap | None = None, domain: str | None = None,
              where: str | None = None) -> list[Task]:
    """The tasks of one file (see the module docstring for formats and mapping).

    ``format``: ``auto`` (by suffix, :func:`detect_format`) or one of :data:`FORMATS`. ``fields``:
    which columns hold the task fields. ``domain``: the default for rows without one. ``where``: the
    label error messages start with (default: the path), e.g. ``spec.dataset.train``.
    A file with no rows gives no tasks. Raises :class:`DatasetError` naming the file, the row and
    the field.
    """
    label = where or str(path)
    noun = "line" if _resolve_format(Path(path), format) == "jsonl" else "row"
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for n, task in _iter_tasks(Path(path), format, fields, domain, where):
        if task.task_id in seen:
            raise DatasetError(f"{label}:{n}: field 'task_id' {task.task_id!r} duplicates {noun} {seen[task.task_id]}")
        seen[task.task_id] = n
        tasks.append(task)
    return tasks


def load_files(paths: Iterable[Path], *, format: str = "auto", fields: FieldMap | None = None,
               domain: str | None = None) -> list[Task]:
    """The tasks of several files (the shards of a split), in the order given; a task id must be unique
    across them (the default ids carry each file's name)."""
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for path in paths:
        for n, task in _iter_tasks(Path(path), format, fields, domain, None):
            if task.task_id in seen:
                raise DatasetError(f"{path}:{n}: field 'task_id' {task.task_id!r} duplicates {seen[task.task_id]}")
            seen[task.task_id] = f"{path}:{n}"
            tasks.append(task)
    return tasks


def load_split(root: Path, split: str, config: str | None = None, *, format: str = "auto",
               fields: FieldMap | None = None, domain: str | None = None) -> list[Task]:
    """The tasks of ``split`` (of ``config``) in the dataset directory ``root`` (:func:`split_files`);
    a split whose files hold no rows is an error naming the split and the root."""
    root = Path(root)
    files = split_files(root, split, config)
    tasks = load_files(files, format=format, fields=fields, domain=domain)
    if not tasks:
        shown = ", ".join(str(f.relative_to(root)) for f in files)
        raise DatasetError(f"split {split!r}{_config_words(config)} of {root} is empty: its files ({shown}) have no rows")
    return tasks


# ---------------------------------------------------------------- Hugging Face repository layout

_SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SEP = "[-._ 0-9]"
_SHARDED = re.compile(r"^data/(?P<split>[^/]+?)-\d{5}-of-\d{5}[^/]*$")
_IGNORED_FILES = {"config.json", "dataset_info.json", "dataset_infos.json", "dataset_dict.json"}


def _config_words(config: str | None) -> str:
    return f" (config {config!r})" if config is not None else ""


def _keywords(split: str) -> tuple[str, ...]:
    return _SPLIT_KEYWORDS.get(split, (split,))


def _dir_re(keywords: Iterable[str]) -> re.Pattern[str]:
    alts = "|".join(re.escape(k) for k in keywords)
    return re.compile(rf"^(?:.*{_SEP})?(?:{alts})(?:{_SEP}.*)?$")


def _file_re(keywords: Iterable[str]) -> re.Pattern[str]:
    alts = "|".join(re.escape(k) for k in keywords)
    return re.compile(rf"^(?:.*{_SEP})?(?:{alts}){_SEP}.*$")


def _visible(rel: Path) -> bool:
    """Not hidden (``.name``), not under a ``__special__`` directory, not a dataset-info file."""
    return (not any(p.startswith(".") or p.startswith("__") for p in rel.parts)
            and rel.name not in _IGNORED_FILES)


def _data_files(base: Path) -> list[Path]:
    """Every data file (a suffix :func:`detect_format` knows) under ``base``, relative, sorted."""
    found = []
    for p in base.rglob("*"):
        rel = p.relative_to(base)
        if p.is_file() and _visible(rel) and _split_suffix(p)[0] is not None:
            found.append(rel)
    return sorted(found, key=lambda r: r.as_posix())


def _in_dir(rel: Path, pattern: re.Pattern[str]) -> bool:
    return any(pattern.match(part) for part in rel.parts[:-1])


def _conventional(base: Path, split: str) -> list[Path]:
    """The split's files under ``base`` by the hub's conventions, tried in its order; the first that
    matches any split decides for all: ``data/<split>-NNNNN-of-NNNNN*``; a directory named by the
    split; a file named by it; else (no split named anywhere) every file is ``train``."""
    files = _data_files(base)
    if any(_SHARDED.match(r.as_posix()) for r in files):
        return [base / r for r in files if (m := _SHARDED.match(r.as_posix())) and m["split"] == split]
    every_split = [k for ks in _SPLIT_KEYWORDS.values() for k in ks] + list(_keywords(split))
    mine_dir, any_dir = _dir_re(_keywords(split)), _dir_re(every_split)
    if any(_in_dir(r, any_dir) for r in files):
        return [base / r for r in files if _in_dir(r, mine_dir)]
    mine_file, any_file = _file_re(_keywords(split)), _file_re(every_split)
    if any(any_file.match(r.name) for r in files):
        return [base / r for r in files if mine_file.match(r.name)]
    return [base / r for r in files] if split == "train" else []


def _readme_configs(root: Path) -> list[dict[str, Any]]:
    """The ``configs:`` of the dataset card's YAML header (``README.md``), or ``[]``."""
    readme = root / "README.md"
    if not readme.is_file():
        return []
    m = re.match(r"^---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", readme.read_text(encoding="utf-8", errors="replace"),
                 re.S)
    if not m:
        return []
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return []  # a card we cannot read: the layout conventions still apply
    configs = meta.get("configs") if isinstance(meta, dict) else None
    if not isinstance(configs, list):
        return []
    return [c for c in configs if isinstance(c, dict) and isinstance(c.get("config_name"), str)]


def _pick_config(configs: list[dict[str, Any]], config: str | None, root: Path) -> dict[str, Any]:
    names = [c["config_name"] for c in configs]
    if config is not None:
        for c in configs:
            if c["config_name"] == config:
                return c
        raise DatasetError(f"{root}: no config {config!r}; its README.md lists: {', '.join(names)}")
    chosen = [c for c in configs if c.get("default") is True] or [c for c in configs if c["config_name"] == "default"]
    if len(chosen) == 1 or len(configs) == 1:
        return (chosen or configs)[0]
    raise DatasetError(f"{root}: it has several configs ({', '.join(names)}) and none is the default; choose one")


def _split_patterns(data_files: Any, where: str) -> dict[str, list[str]]:
    """A card's ``data_files`` as ``{split: [glob]}`` (a bare pattern or list is the ``train`` split)."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, dict):
        return {str(k): [v] if isinstance(v, str) else list(v) for k, v in data_files.items()}
    if isinstance(data_files, list) and all(isinstance(x, str) for x in data_files):
        return {"train": list(data_files)}
    if isinstance(data_files, list) and all(isinstance(x, dict) and "split" in x and "path" in x for x in data_files):
        return {str(x["split"]): [x["path"]] if isinstance(x["path"], str) else list(x["path"]) for x in data_files}
    raise DatasetError(f"{where}: data_files is neither a pattern, a list of patterns nor a list of {{split, path}}")


def _card_files(root: Path, cfg: dict[str, Any], split: str) -> list[Path]:
    """The split's files as the README's config entry names them (its ``data_files`` globs, else the
    conventions under its ``data_dir``)."""
    where = f"{root / 'README.md'}: config {cfg['config_name']!r}"
    if cfg.get("data_files") is None:
        data_dir = root / str(cfg.get("data_dir") or ".")
        return _conventional(data_dir, split) if data_dir.is_dir() else []
    patterns = _split_patterns(cfg["data_files"], where)
    if split not in patterns:
        raise DatasetError(f"{where} has no split {split!r} (its splits: {', '.join(patterns)}), in {root}")
    found: dict[str, Path] = {}
    for pattern in patterns[split]:
        for p in root.glob(str(pattern).lstrip("/")):
            if p.is_file() and _visible(p.relative_to(root)):
                found.setdefault(p.relative_to(root).as_posix(), p)
    return [found[k] for k in sorted(found)]


def _config_dirs(root: Path, files: list[Path]) -> list[str]:
    """The distinct first-level directories of ``files`` that look like configs (not ``data``, not a split)."""
    split_dir = _dir_re([k for ks in _SPLIT_KEYWORDS.values() for k in ks])
    tops = {f.relative_to(root).parts[0] for f in files if len(f.relative_to(root).parts) > 1}
    return sorted(t for t in tops if t != "data" and not split_dir.match(t))


def split_files(root: Path, split: str, config: str | None = None) -> list[Path]:
    """The files of ``split`` in a dataset directory laid out as a Hugging Face dataset repository
    without a loading script, sorted by path (shards in order).

    When the dataset card (``README.md``) has ``configs:``, the config named ``config`` (else the
    default one, or the only one) gives the files: its ``data_files`` globs for the split, or the
    conventions below under its ``data_dir``. Otherwise ``config`` names a subdirectory
    (``main/test-00000-of-00001.parquet``: GSM8K's config ``main``) and the hub's conventions apply in
    it, the first that matches any split deciding for all: ``data/<split>-00000-of-00002*``; a
    directory named by the split (``train/``, ``data/train-en/``); a file named by it (``train.jsonl``,
    ``data/train-00000.parquet``, ``test_x.csv``); else, with no split named anywhere, every file is the
    ``train`` split. ``train``/``validation``/``test`` also answer to the hub's synonyms (``training``;
    ``valid``, ``dev``, ``val``; ``testing``, ``eval``, ``evaluation``). Hidden files and directories,
    ``__special__`` directories and ``dataset_info.json``-like files are skipped.

    Raises :class:`DatasetError` naming the split and the root when no file matches, when files of
    several config directories match and ``config`` is not given, and when the files mix formats.
    (:func:`load_split` loads them and refuses files with no rows.)
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory")
    configs = _readme_configs(root)
    if configs:
        files = _card_files(root, _pick_config(configs, config, root), split)
    elif config is not None:
        if not (root / config).is_dir():
            raise DatasetError(f"{root}: no config {config!r} (no {config}/ directory, no configs in a README.md)")
        files = _conventional(root / config, split)
    else:
        files = _conventional(root, split)
        several = _config_dirs(root, files)
        if len(several) > 1:
            raise DatasetError(f"split {split!r} of {root}: files in several config directories "
                               f"({', '.join(several)}); choose a config")
    if not files:
        raise DatasetError(f"split {split!r}{_config_words(config)} of {root} is empty: no data files "
                           f"({', '.join(_SUFFIXES)}) named for it")
    formats = collections.Counter(detect_format(f) for f in files)
    if len(formats) > 1:
        raise DatasetError(f"split {split!r}{_config_words(config)} of {root} mixes formats "
                           f"({', '.join(sorted(formats))}); keep one")
    return files
