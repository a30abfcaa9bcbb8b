"""Sequence packing (``trainer.sequencePacking``): a micro-batch's rows run as one sequence, no padding.

The rows' real tokens are concatenated into one row of ``sum(lengths)`` tokens, with position ids that
restart at 0 for each row. transformers reads a packed sequence from such position ids when it is given
no attention mask and no cache (``masking_utils.find_packed_sequence_indices``): its attention mask is
then causal *within* each row and blocks attention *across* rows (a block-diagonal causal mask for
``sdpa``, and the trainer's float32 ``sdpa`` on the CPU; variable-length kernels for flash attention).
Every token so sees exactly the tokens it sees in its own padded row, at the same rotary positions, and
the log-probs and the loss are the padded computation's up to float rounding
(``tests/trainer/test_packing.py``: 1e-6 in float64, 1e-5 in float32).

The output layer runs only on the packed positions whose predictions the loss reads (from the batch's
first response column on, as the padded path's ``logits_to_keep``), and :func:`packed_logits` returns
them laid out as the padded path's ``[B, W - start, V]``, so that everything after the forward is the
same code. Positions past a row's end (padding there) hold a copy of a real logit row, which the loss
mask drops.

What it saves is the padding's compute: rows of one micro-batch padded to its longest (after the
trainer has sorted rows by length, the difference is what remains within each micro-batch). With a
dense mask (``sdpa``) attention runs over the whole packed sequence's query-key pairs, masked: a cost
quadratic in the packed length, where the padded path's is quadratic in each row's. Flash attention's
variable-length kernel has no such cost. ``bench/packing.py`` measures both paths.
"""

from __future__ import annotations

from typing import Any

import torch


def packed_layout(lengths: list[int], start: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For rows of ``lengths`` tokens (a micro-batch padded to ``width``): the packed position ids
    ``[1, sum(lengths)]``, the packed positions whose logits the loss reads (``keep``, ascending), and
    ``index [B, width - 1 - start]``: for padded target column ``start + j`` of row ``b``, its entry in
    ``keep`` (a real row's last kept entry past its end)."""
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    keep: list[int] = []
    cols = width - 1 - start
    index = torch.zeros((len(lengths), max(cols, 0)), dtype=torch.long)
    offset = 0
    for b, n in enumerate(lengths):
        first = len(keep)
        keep.extend(range(offset + start, offset + n - 1))  # column j predicts token j + 1 of the row
        got = len(keep) - first
        if got:
            index[b, :got] = torch.arange(first, first + got)
            index[b, got:] = first + got - 1
        offset += n
    return positions, torch.tensor(keep, dtype=torch.long), index


def packed_logits(model: torch.nn.Module, batch: Any, start: int, device: torch.device) -> torch.Tensor | None:
    """The logits ``[B, W - 1 - start, V]`` (float32) predicting ``batch.targets[:, start:]`` computed with
    the rows packed into one sequence (see the module); None where no row has a position to predict
    from ``start`` on (the caller runs the padded forward)."""
    lengths = [int(n) for n in batch.lengths.tolist()]
    width = int(batch.input_ids.shape[1])
    positions, keep, index = packed_layout(lengths, start, width)
    if len(keep) == 0:
        return None
    ids = torch.cat([batch.input_ids[b, :n] for b, n in enumerate(lengths)]).unsqueeze(0)
    out = model(input_ids=ids.to(device), position_ids=positions.to(device), attention_mask=None,
                use_cache=False, logits_to_keep=keep.to(device))
    logits = out.logits[0]  # [len(keep), V]
    return logits[index.to(device)].float()
