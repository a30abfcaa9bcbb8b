"""Datasets: the Task type, builtin generated datasets, JSONL files, JSON/Parquet/CSV files and Hugging Face
repository splits, a resumable cursor, domain mixing."""

from . import arithmetic as _arithmetic  # noqa: F401  (registers "arithmetic")
from . import gsm8k_synth as _gsm8k_synth  # noqa: F401  (registers "gsm8k_synth")
from .cursor import DataCursor, epoch_order, tasks_fingerprint
from .files import FORMATS, FieldMap, detect_format, load_file, load_files, load_split, split_files
from .jsonl import load_jsonl, parse_jsonl_row, write_jsonl
from .mixing import DomainMixCursor, apportion
from .registry import get_dataset, list_datasets, load_builtin, register_dataset
from .task import DatasetError, Task

__all__ = [
    "DataCursor",
    "FORMATS",
    "FieldMap",
    "DatasetError",
    "DomainMixCursor",
    "apportion",
    "detect_format",
    "Task",
    "epoch_order",
    "get_dataset",
    "list_datasets",
    "load_builtin",
    "load_file",
    "load_files",
    "load_jsonl",
    "load_split",
    "parse_jsonl_row",
    "register_dataset",
    "split_files",
    "tasks_fingerprint",
    "write_jsonl",
]
