"""A short supervised pass so a builtin task's rewards are not all zero at RL step 0.

Teacher forcing on ``chat_template(prompt + assistant answer)`` with the loss on assistant tokens
only (the template's ``{% generation %}`` span: the answer and its ``<|im_end|>``). The assistant
target is ``task.metadata["solution"]`` when present, else ``str(task.ground_truth)``. Training
tasks come from the builtin dataset with a seed disjoint from the ones RL uses by default
(``WARM_START_DATA_SEED + seed``), so RL and evaluation see mostly unseen prompts.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..data.registry import load_builtin
from ..data.task import Task
from .tiny import BUILD_INFO_FILE, save_checkpoint, seeded_torch

__all__ = ["WarmStartResult", "warm_start", "encode_sft_example", "WARM_START_DATA_SEED"]

WARM_START_DATA_SEED = 1_000_003


@dataclass(frozen=True)
class WarmStartResult:
    """What :func:`warm_start` did."""

    out_dir: Path
    steps: int
    final_loss: float
    seconds: float
    cpu_seconds: float


def encode_sft_example(tokenizer: Any, task: Task) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` of the task's prompt followed by its reference answer."""
    answer = task.metadata.get("solution", str(task.ground_truth))
    messages = task.chat_messages() + [{"role": "assistant", "content": answer}]
    enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
    if not any(mask):
        raise ValueError(f"warm start: task {task.task_id!r} has no assistant tokens to train on")
    return ids, mask


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, mask) in enumerate(examples):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(ids), -100)
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def warm_start(
    model_dir: str | Path,
    dataset_name: str = "arithmetic",
    steps: int = 300,
    seed: int = 0,
    out_dir: str | Path | None = None,
    *,
    lr: float = 3e-3,
    batch_size: int = 32,
    num_tasks: int = 2000,
    threads: int | None = 1,
    dataset_options: dict[str, Any] | None = None,
) -> WarmStartResult:
    """Fine-tune the model in ``model_dir`` for ``steps`` AdamW steps and save it to ``out_dir``.

    ``out_dir`` defaults to ``model_dir`` (overwritten in place). Deterministic for the same
    arguments and thread count (``threads`` pins torch's intra-op threads during the pass; the
    previous value is restored).
    """
    if steps < 0:
        raise ValueError(f"warm start: field 'steps' must be >= 0, got {steps}")
    started, cpu_started = time.perf_counter(), time.process_time()
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir is not None else model_dir
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tasks = load_builtin(dataset_name, num_tasks, seed=WARM_START_DATA_SEED + seed, **(dataset_options or {}))
    examples = [encode_sft_example(tokenizer, t) for t in tasks]
    loss_value = float("nan")
    with seeded_torch(seed, threads):
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
        gen = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(steps):
            idx = torch.randint(len(examples), (batch_size,), generator=gen).tolist()
            loss = model(**_batch([examples[i] for i in idx], tokenizer.pad_token_id)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            loss_value = float(loss.detach())
    model.eval()
    info_path = model_dir / BUILD_INFO_FILE
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    info["warm_start"] = {"dataset": dataset_name, "steps": steps, "seed": seed, "lr": lr,
                          "batch_size": batch_size, "num_tasks": num_tasks,
                          "dataset_options": dataset_options or {}}
    save_checkpoint(model, out, info)
    return WarmStartResult(out, steps, loss_value, time.perf_counter() - started,
                           time.process_time() - cpu_started)


def warm_start_result_dict(r: WarmStartResult) -> dict[str, Any]:
    """JSON-ready form of a :class:`WarmStartResult`."""
    d = asdict(r)
    d["out_dir"] = str(r.out_dir)
    return d
