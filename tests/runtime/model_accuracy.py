"""Offline sampling and accuracy with transformers, to measure a model on a dataset (a test tool).

Not the inference server: it samples with
``model.generate`` (pure temperature sampling, no top-k/top-p) from the chat-templated prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from rft_runtime.data.task import Task
from rft_runtime.model.tiny import seeded_torch

__all__ = ["AccuracyReport", "sample_texts", "last_number_matches", "accuracy"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number_matches(text: str, ground_truth: Any) -> bool:
    """True when the last number in ``text`` equals ``ground_truth`` numerically."""
    found = _NUMBER.findall(text.replace(",", ""))
    if not found:
        return False
    try:
        return float(found[-1]) == float(str(ground_truth).replace(",", ""))
    except ValueError:
        return False


@torch.no_grad()
def sample_texts(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    *,
    temperature: float = 1.0,
    max_tokens: int = 16,
    seed: int = 0,
    batch_size: int = 64,
) -> list[str]:
    """One completion per task (``temperature`` 0 = greedy), decoded without special tokens."""
    texts: list[str] = []
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        with seeded_torch(seed):
            for start in range(0, len(tasks), batch_size):
                chunk = tasks[start : start + batch_size]
                prompts = [tokenizer.apply_chat_template(t.chat_messages(), tokenize=False,
                                                         add_generation_prompt=True) for t in chunk]
                enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
                kwargs: dict[str, Any] = {"do_sample": False}
                if temperature > 0:
                    kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                out = model.generate(**enc, max_new_tokens=max_tokens, eos_token_id=tokenizer.eos_token_id,
                                     pad_token_id=tokenizer.pad_token_id, **kwargs)
                new = out[:, enc["input_ids"].shape[1]:]
                texts.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = old_side
    return texts


@dataclass(frozen=True)
class AccuracyReport:
    """Fraction of tasks whose sampled answer's last number equals the ground truth."""

    accuracy: float
    correct: int
    total: int
    temperature: float
    max_tokens: int


def accuracy(
    model_or_dir: Any,
    tasks: Sequence[Task],
    *,
    temperature: float = 1.0,
    max_tokens: int = 16,
    seed: int = 0,
    tokenizer: Any = None,
) -> AccuracyReport:
    """Sample one completion per task and grade it with :func:`last_number_matches`."""
    if isinstance(model_or_dir, (str, Path)):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_or_dir)
        model = AutoModelForCausalLM.from_pretrained(model_or_dir)
    else:
        model = model_or_dir
        if tokenizer is None:
            raise ValueError("accuracy: field 'tokenizer' is required when passing a model object")
    model.eval()
    texts = sample_texts(model, tokenizer, tasks, temperature=temperature, max_tokens=max_tokens, seed=seed)
    correct = sum(last_number_matches(x, t.ground_truth) for x, t in zip(texts, tasks))
    return AccuracyReport(correct / max(len(tasks), 1), correct, len(tasks), temperature, max_tokens)
