"""Loss aggregation: hand values, a plain-loop reference, the global normaliser, errors."""

from __future__ import annotations

import random

import pytest
import torch

from rft_runtime.algos import LOSS_AGGREGATIONS, aggregate_loss, compute_global_normaliser

D = torch.float64
LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 100.0, 100.0], [100.0] * 4], dtype=D)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 15 / 5),
        ("seq-mean-token-sum", (6 + 9) / 2),
        ("seq-mean-token-mean", (2 + 4.5) / 2),
        ("seq-mean-token-sum-norm", (6 + 9) / 10 / 2),
    ],
)
def test_hand_values(mode: str, expected: float) -> None:
    # the fully masked third row neither adds loss nor counts as a sequence
    assert aggregate_loss(mode, LOSS, MASK, max_len=10).item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("token-mean", 15 / 20), ("seq-mean-token-sum", 15 / 4), ("seq-mean-token-mean", 6.5 / 4), ("seq-mean-token-sum-norm", 15 / 10 / 4)],
)
def test_explicit_global_normaliser(mode: str, expected: float) -> None:
    got = aggregate_loss(mode, LOSS, MASK, global_normaliser=20 if mode == "token-mean" else 4, max_len=10)
    assert got.item() == pytest.approx(expected, abs=1e-12)


def test_units_and_normaliser() -> None:
    assert LOSS_AGGREGATIONS["token-mean"].unit == "token"
    for m in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert LOSS_AGGREGATIONS[m].unit == "sequence"
    assert compute_global_normaliser("token-mean", MASK) == 5.0
    assert compute_global_normaliser("seq-mean-token-mean", MASK) == 2.0
    parts = [MASK[:1, :3], MASK[1:, :2]]  # micro-batches trimmed to different widths
    assert compute_global_normaliser("token-mean", parts) == 5.0
    assert compute_global_normaliser("seq-mean-token-sum", parts) == 2.0
    assert compute_global_normaliser("token-mean", torch.zeros(2, 3)) == 1.0  # never 0


def test_errors() -> None:
    with pytest.raises(ValueError, match="max_len"):
        aggregate_loss("seq-mean-token-sum-norm", LOSS, MASK)
    with pytest.raises(ValueError, match="max_len"):
        aggregate_loss("seq-mean-token-sum-norm", LOSS, MASK, max_len=0)
    with pytest.raises(ValueError, match="global_normaliser"):
        aggregate_loss("token-mean", LOSS, MASK, global_normaliser=0)
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss("token-mean", LOSS, MASK[:2])
    with pytest.raises(ValueError, match="per_token_loss"):
        aggregate_loss("token-mean", LOSS[0], MASK[0])
    with pytest.raises(KeyError, match="token-mean"):
        aggregate_loss("mean", LOSS, MASK)


def _ref(mode: str, loss: list[list[float]], mask: list[list[bool]], max_len: int) -> float:
    total_tokens = sum(sum(row) for row in mask)
    seqs = [i for i, row in enumerate(mask) if any(row)]
    if mode == "token-mean":
        return sum(x for lr, mr in zip(loss, mask) for x, m in zip(lr, mr) if m) / max(total_tokens, 1)
    acc = 0.0
    for i in seqs:
        s = sum(x for x, m in zip(loss[i], mask[i]) if m)
        if mode == "seq-mean-token-mean":
            s /= sum(mask[i])
        elif mode == "seq-mean-token-sum-norm":
            s /= max_len
        acc += s
    return acc / max(len(seqs), 1)


@pytest.mark.parametrize("mode", sorted(LOSS_AGGREGATIONS.names()))
def test_vectorised_matches_reference_loop_and_accumulation(mode: str) -> None:
    for seed in range(50):
        rng = random.Random(seed)
        B, T = rng.randint(1, 8), rng.randint(1, 9)
        loss = [[rng.gauss(0, 3) for _ in range(T)] for _ in range(B)]
        mask = [[rng.random() > 0.3 for _ in range(T)] for _ in range(B)]
        lt, mt = torch.tensor(loss, dtype=D), torch.tensor(mask)
        full = aggregate_loss(mode, lt, mt, max_len=16)
        assert full.item() == pytest.approx(_ref(mode, loss, mask, 16), abs=1e-10), f"seed {seed}"
        # any split into micro-batches, each with the global normaliser, sums to the full loss
        cuts = sorted(rng.sample(range(1, B), k=rng.randint(0, B - 1))) if B > 1 else []
        bounds = [0, *cuts, B]
        norm = compute_global_normaliser(mode, mt)
        parts = sum(
            aggregate_loss(mode, lt[a:b], mt[a:b], global_normaliser=norm, max_len=16).item()
            for a, b in zip(bounds, bounds[1:])
        )
        assert parts == pytest.approx(full.item(), abs=1e-10), f"seed {seed}"
