"""Datasets: the Task type, builtin generated datasets, JSONL files, a resumable cursor, domain mixing."""

from . import arithmetic as _arithmetic  # noqa: F401  (registers "arithmetic")
from . import gsm8k_synth as _gsm8k_synth  # noqa: F401  (registers "gsm8k_synth")
from .cursor import DataCursor, epoch_order, tasks_fingerprint
from .jsonl import load_jsonl, parse_jsonl_row, write_jsonl
from .mixing import DomainMixCursor, apportion
from .registry import get_dataset, list_datasets, load_builtin, register_dataset
from .task import DatasetError, Task

__all__ = [
    "DataCursor",
    "DatasetError",
    "DomainMixCursor",
    "apportion",
    "Task",
    "epoch_order",
    "get_dataset",
    "list_datasets",
    "load_builtin",
    "load_jsonl",
    "parse_jsonl_row",
    "register_dataset",
    "tasks_fingerprint",
    "write_jsonl",
]
