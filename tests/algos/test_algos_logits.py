"""logprobs_from_logits and entropy_from_logits against plain torch references."""

from __future__ import annotations

import pytest
import torch

from rft_runtime.algos import entropy_from_logits, logprobs_from_logits

D = torch.float64


def _ref_logprobs(logits: torch.Tensor, ids: torch.Tensor, t: float) -> torch.Tensor:
    return torch.log_softmax(logits / t, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
@pytest.mark.parametrize("chunk_rows", [1, 4, 512])
def test_values_and_gradients_match_reference(temperature: float, chunk_rows: int) -> None:
    g = torch.Generator().manual_seed(int(temperature * 10) + chunk_rows)
    logits = (3 * torch.randn(3, 5, 11, generator=g, dtype=D)).requires_grad_(True)
    ids = torch.randint(0, 11, (3, 5), generator=g)
    upstream = torch.randn(3, 5, generator=g, dtype=D)
    got = logprobs_from_logits(logits, ids, temperature, chunk_rows=chunk_rows)
    ref = _ref_logprobs(logits, ids, temperature)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-12)
    (g_got,) = torch.autograd.grad((got * upstream).sum(), logits)
    (g_ref,) = torch.autograd.grad((ref * upstream).sum(), logits)
    torch.testing.assert_close(g_got, g_ref, atol=1e-12, rtol=1e-10)


def test_gradcheck() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=D, requires_grad=True)
    ids = torch.randint(0, 5, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda x: logprobs_from_logits(x, ids, 0.8, chunk_rows=2), (logits,))


def test_non_contiguous_shifted_logits() -> None:
    g = torch.Generator().manual_seed(1)
    full = torch.randn(4, 7, 9, generator=g, dtype=D, requires_grad=True)
    ids = torch.randint(0, 9, (4, 7), generator=g)
    shifted = full[:, :-1]  # the usual "position t predicts token t+1" view
    assert not shifted.is_contiguous()
    got = logprobs_from_logits(shifted, ids[:, 1:], chunk_rows=4)
    ref = _ref_logprobs(shifted, ids[:, 1:], 1.0)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-12)
    (g_got,) = torch.autograd.grad(got.sum(), full)
    (g_ref,) = torch.autograd.grad(ref.sum(), full)
    torch.testing.assert_close(g_got, g_ref, atol=1e-12, rtol=1e-10)
    assert g_got[:, -1].abs().sum() == 0


def test_low_precision_upcast() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 17, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 17, (2, 3), generator=g)
    got = logprobs_from_logits(logits, ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _ref_logprobs(logits.float(), ids, 1.0), atol=1e-6, rtol=1e-6)


def test_entropy() -> None:
    g = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(3, 4, 13, generator=g, dtype=D)
    for t in (0.5, 1.0, 2.0):
        p = torch.softmax(logits / t, -1)
        ref = -(p * torch.log_softmax(logits / t, -1)).sum(-1)
        torch.testing.assert_close(entropy_from_logits(logits, t, chunk_rows=5), ref, atol=1e-12, rtol=1e-12)
    uniform = entropy_from_logits(torch.zeros(1, 8, dtype=D))
    assert uniform.item() == pytest.approx(torch.log(torch.tensor(8.0, dtype=D)).item())
    assert entropy_from_logits(logits[:, :-1]).shape == (3, 3)


def test_errors() -> None:
    with pytest.raises(ValueError, match="ids"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(2, 5), temperature=-1.0)
