"""Shared-prompt forward passes: a prompt that several rows of a micro-batch share is run once.

A GRPO group is ``n`` samples of one prompt, so a micro-batch cut from one group holds ``n`` copies of
the same prompt tokens. Here the micro-batch's distinct prompts go through the model once (right-padded,
keeping their key/value cache with its autograd graph), the cache is repeated for the rows that share
each prompt, and only the rows' continuations (responses, and the tool tokens of later turns) go
through the model a second time, attending to their prompt's cache. The backward pass sums each
prompt's gradients over its rows, so the loss and the gradients are those of running every row
whole, up to float rounding (``tests/trainer/test_prefix.py``).

:func:`order_rows` cuts micro-batches so that rows of one prompt sit together when that is cheaper (in
tokens run) than cutting by length. Fewer tokens is less time where the step is bound by the tokens it
runs (the CPU, a large enough model); on the tiny sample model the step is bound by per-operation
overhead and sharing saves nothing (``docs/trainer.md``, "Speed").
"""

from __future__ import annotations

from typing import Any

import torch

SHARE_PROMPTS = True
"""Run a micro-batch's shared prompts once (False: every row whole; for benchmarks and tests)."""

SHARE_ON = frozenset({"cpu"})
"""The device types on which prompts are shared. On one H200 (365 M parameters, bf16, micro-batches of
16 rows holding one or two prompts of 256 tokens) the two forward passes made the step slower, 0.98-1.32 s
against 0.59-0.62 s for whole rows, although they ran fewer tokens (``bench/trainer_vs_trl.py``,
``ours`` against ``ours_whole_rows``): there the step is bound by launching kernels, and a second
forward per micro-batch costs more launches than the tokens it saves. On the CPU the step is bound by
the tokens it runs, and sharing saves them."""


def shares(device: torch.device) -> bool:
    """Whether micro-batches on ``device`` run their shared prompts once."""
    return SHARE_PROMPTS and device.type in SHARE_ON


def _prompt_keys(batch: Any, rows: torch.Tensor | None = None) -> list[int]:
    """For each row (of ``rows``, or of the batch), the index of its prompt among the distinct prompts,
    numbered in order of first appearance."""
    ids = batch.input_ids if rows is None else batch.input_ids[rows]
    plen = batch.prompt_lengths if rows is None else batch.prompt_lengths[rows]
    index: dict[tuple[int, ...], int] = {}
    return [index.setdefault(tuple(ids[i, :p].tolist()), len(index)) for i, p in enumerate(plen.tolist())]


def prompt_owners(batch: Any, collective: bool = False) -> tuple[list[int], list[int]] | None:
    """``(leaders, owner)``: the first row of each distinct prompt, and for every row the index of its
    prompt in ``leaders``; None when no two rows share a prompt (or prompt lengths are unknown).

    ``collective``: the model is sharded over several ranks, whose forward passes are collectives and
    must match in number; then every micro-batch takes the shared path (two forwards) whether or not
    its rows share a prompt."""
    if batch.prompt_lengths is None:
        return None
    owner = _prompt_keys(batch)
    leaders = [owner.index(u) for u in range(max(owner) + 1)]
    return (leaders, owner) if collective or len(leaders) < len(owner) else None


def _cost_whole(lengths: list[int], chunks: list[list[int]]) -> int:
    return sum(len(c) * max(lengths[i] for i in c) for c in chunks)


def _cost_shared(lengths: list[int], prompts: list[int], keys: list[int], chunks: list[list[int]]) -> int:
    total = 0
    for c in chunks:
        distinct = {keys[i]: prompts[i] for i in c}
        if len(distinct) == len(c):  # nothing shared: one whole forward
            total += _cost_whole(lengths, [c])
        else:
            total += len(distinct) * max(distinct.values()) + len(c) * max(lengths[i] - prompts[i] for i in c)
    return total


def order_rows(batch: Any, rows: torch.Tensor, size: int, share: bool = True) -> torch.Tensor:
    """Positions into ``rows`` in the order micro-batches of ``size`` are cut: by length (so each
    micro-batch is trimmed to little padding), or, when cheaper in tokens run, rows of one prompt
    together (ordered by prompt length, then by length), so each micro-batch runs few prompts
    (``share``: prompts are shared, see :func:`shares`)."""
    lengths = batch.lengths[rows]
    # by length (stable): micro-batches of similar lengths, each trimmed to its own longest row by
    # TrainBatch.select; gradients are accumulated over the whole batch, so the order changes nothing
    # but float rounding
    by_len = torch.argsort(lengths, stable=True)
    if batch.prompt_lengths is None or not share:
        return by_len
    prompts = batch.prompt_lengths[rows].tolist()
    keys = _prompt_keys(batch, rows)
    if len(set(keys)) == len(keys):
        return by_len
    lens = lengths.tolist()
    grouped = sorted(range(len(keys)), key=lambda i: (prompts[i], keys[i], lens[i]))
    cut = [list(range(i, min(i + size, len(keys)))) for i in range(0, len(keys), size)]
    by_len_l = by_len.tolist()
    whole = _cost_whole(lens, [[by_len_l[j] for j in c] for c in cut])
    shared = _cost_shared(lens, prompts, keys, [[grouped[j] for j in c] for c in cut])
    return torch.tensor(grouped, dtype=torch.long) if shared < whole else by_len


def shared_logits(model: torch.nn.Module, batch: Any, start: int, plan: tuple[list[int], list[int]],
                  device: torch.device, collective: bool = False) -> torch.Tensor:
    """The logits ``[B, W - start, V]`` (float32) predicting ``batch.targets[:, start:]``, as a whole
    forward of every row gives them, computed with each distinct prompt run once (see the module)."""
    leaders, owner_l = plan
    plen = batch.prompt_lengths
    width = int(batch.input_ids.shape[1])
    u_len = [int(plen[r]) for r in leaders]
    p_max = max(u_len)
    prompt_ids = torch.zeros((len(leaders), p_max), dtype=torch.long)
    prompt_mask = torch.zeros((len(leaders), p_max), dtype=torch.long)
    for u, r in enumerate(leaders):  # right-padded: a padding position attends to real tokens, never to none
        prompt_ids[u, : u_len[u]] = batch.input_ids[r, : u_len[u]]
        prompt_mask[u, : u_len[u]] = 1
    # the output layer only at each prompt's last position (the prediction of its first response token)
    lasts = sorted(set(n - 1 for n in u_len))
    keep = torch.tensor(lasts, dtype=torch.long, device=device)
    out = model(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device), use_cache=True,
                logits_to_keep=keep)
    owner = torch.tensor(owner_l, dtype=torch.long)
    col = torch.tensor([lasts.index(n - 1) for n in u_len], dtype=torch.long)
    first = out.logits[owner.to(device), col[owner].to(device)]  # [B, V]: predicts token p of each row
    cache = out.past_key_values
    if cache is None:  # a model that drops its cache while training (gradient checkpointing) cannot share
        raise RuntimeError(f"{type(model).__name__} returned no key/value cache; set "
                           "rft_runtime.trainer.prefix.SHARE_PROMPTS = False to run every row whole")
    cache.batch_select_indices(owner.to(device))

    rest = (batch.lengths - plen).tolist()
    c_max = max(rest)
    if c_max <= 1 and not collective:  # no continuation token predicts another: the prompts' last logits
        seq = first.unsqueeze(1).float()  # are all there is
    else:
        c_max = max(c_max, 2)  # (collective: the second forward runs on every rank, here on padding)
        cont_ids = torch.zeros((len(owner_l), c_max), dtype=torch.long)
        cont_mask = torch.zeros((len(owner_l), c_max), dtype=torch.long)
        for b, (p, n) in enumerate(zip(plen.tolist(), rest)):
            cont_ids[b, :n] = batch.input_ids[b, p : p + n]
            cont_mask[b, :n] = 1
        mask = torch.cat([prompt_mask[owner], cont_mask], dim=1)
        positions = plen.unsqueeze(1) + torch.arange(c_max).unsqueeze(0)
        out2 = model(input_ids=cont_ids.to(device), attention_mask=mask.to(device),
                     position_ids=positions.to(device), past_key_values=cache, use_cache=True,
                     logits_to_keep=torch.arange(c_max - 1, device=device))
        # column k of `seq` predicts target index p - 1 + k of its row
        seq = torch.cat([first.unsqueeze(1), out2.logits[:, : max(max(rest) - 1, 0)]], dim=1).float()
    # align to target indices start .. width - 2 (off a row's span: some real logits, masked by the loss)
    idx = (torch.arange(start, width - 1).unsqueeze(0) - (plen - 1).unsqueeze(1)).clamp_(0, seq.shape[1] - 1)
    return seq.gather(1, idx.to(device).unsqueeze(-1).expand(-1, -1, seq.shape[-1]))
