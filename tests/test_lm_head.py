"""Tiled full-vocabulary log-sum-exp and token log-probabilities of the LM head."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from genrec.model import lm_head

pytestmark = pytest.mark.numerics


@pytest.fixture
def head() -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(48, 1000, bias=False).requires_grad_(False)
    with torch.no_grad():
        layer.weight.mul_(8)  # logits of several units
    return layer


@pytest.mark.parametrize(("rows", "vocab_slice"), [(64, 96), (1024, 4096)])
def test_tiled_logsumexp_equals_float64(head: nn.Linear, monkeypatch: pytest.MonkeyPatch,
                                        rows: int, vocab_slice: int) -> None:
    # several row blocks and vocabulary slices, the last of each partial
    monkeypatch.setattr(lm_head, "ROW_BLOCK", rows)
    monkeypatch.setattr(lm_head, "VOCAB_SLICE", vocab_slice)
    hidden = torch.randn(150, 48)
    with torch.inference_mode():
        got = lm_head.vocab_logsumexp(head, hidden)
    ref = torch.logsumexp(hidden.double() @ head.weight.double().T, dim=-1)
    assert got.dtype == torch.float32 and got.shape == (150,)
    assert (got.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


def test_token_logprobs_match_log_softmax(head: nn.Linear) -> None:
    hidden, targets = torch.randn(37, 48), torch.randint(0, 1000, (37,))
    with torch.inference_mode():
        got = lm_head.token_logprobs(head, hidden, targets)
    ref = torch.log_softmax(hidden.double() @ head.weight.double().T, -1)
    ref = ref.gather(1, targets[:, None])[:, 0]
    assert (got.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()
    assert lm_head.token_logprobs(head, hidden[:0], targets[:0]).shape == (0,)


def test_autograd_path_has_gradients(head: nn.Linear) -> None:
    head.requires_grad_(True)
    hidden = torch.randn(9, 48, requires_grad=True)
    logp = lm_head.token_logprobs(head, hidden, torch.randint(0, 1000, (9,)))
    logp.sum().backward()
    assert hidden.grad is not None and head.weight.grad is not None
    ref = torch.log_softmax(hidden @ head.weight.T, -1)
    assert torch.allclose(torch.logsumexp(hidden @ head.weight.T, -1),
                          lm_head.vocab_logsumexp(head, hidden), atol=1e-5)
    assert ref.shape == (9, 1000)


def test_bf16_head_normalises_in_fp32(head: nn.Linear) -> None:
    bf16 = head.to(torch.bfloat16)
    hidden = torch.randn(20, 48).to(torch.bfloat16)
    with torch.inference_mode():
        got = lm_head.vocab_logsumexp(bf16, hidden)
    ref = torch.logsumexp(hidden.double() @ bf16.weight.double().T, dim=-1)
    assert got.dtype == torch.float32
    assert (got.double() - ref).abs().max().item() < 0.05 * ref.abs().max().item()


@pytest.mark.parametrize("native", ["onednn", "mkl", None])
@pytest.mark.parametrize(("offset", "size"), [(0, 96), (90, 20), (900, 100), (10, 700)])
def test_range_logprobs_match_log_softmax(head: nn.Linear, monkeypatch: pytest.MonkeyPatch,
                                          native: str | None, offset: int, size: int) -> None:
    # a level's codes inside one slice of the head, across slices, at its end; the native
    # call (over either weight form) and the PyTorch tiles alike
    from genrec import kernels

    if native and kernels.range_logprobs_op() is None:
        pytest.skip("the native CPU kernels are not built here")
    if native:
        monkeypatch.setenv("GENREC_CPU_GEMM", native)
    else:
        monkeypatch.setenv("GENREC_NATIVE_LAYERS", "0")
    monkeypatch.setattr(lm_head, "VOCAB_SLICE", 96)
    hidden = torch.randn(33, 48)
    with torch.inference_mode():
        got = lm_head.range_logprobs(head, hidden, offset, size)
    ref = torch.log_softmax(hidden.double() @ head.weight.double().T, dim=-1)
    assert got.shape == (33, size)
    assert (got.double() - ref[:, offset : offset + size]).abs().max().item() < 1e-4
