"""attend: the fused kernels only on tested torch releases, a failing call answered by the
math path (logged once, counted), out of memory raised on, the public output-only path."""

from __future__ import annotations

import logging

import pytest
import torch

from genrec.model import grid_attention as attend_mod
from genrec.model.grid_attention import (
    attend,
    attend_math,
    attend_output,
    attention_fallbacks,
    private_ops_tested,
)

OP = "_scaled_dot_product_flash_attention_for_cpu"
REAL_OP = getattr(torch.ops.aten, OP)


def _inputs(causal: bool):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, 7, 8, generator=g) for h in (4, 2, 2))
    mask = torch.zeros(2, 1, 1, 7)
    mask[1, ..., 5:] = float("-inf")
    return q, k, v, mask, causal, 0.3


def _counting(monkeypatch: pytest.MonkeyPatch, fail: BaseException | None) -> list[int]:
    """Replaces torch's private CPU flash op by one that counts its calls (and raises
    ``fail`` where given, else runs the real op)."""
    calls: list[int] = []

    def op(*args, **kwargs):
        calls.append(1)
        if fail is not None:
            raise fail
        return REAL_OP(*args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, OP, op)
    return calls


@pytest.mark.parametrize(("version", "tested"), [
    ("2.6.0", True), ("2.11.0+cu128", True), ("2.13.0+cpu", True), ("2.5.1", False),
    ("2.14.0.dev20260101", False), ("3.0.0", False), ("nightly", False)])
def test_private_ops_only_on_tested_releases(version: str, tested: bool) -> None:
    assert private_ops_tested(version) is tested


def test_running_torch_takes_the_fused_kernel_and_it_agrees(monkeypatch) -> None:
    # on each torch the project supports: the private kernel runs (within the tested range)
    # or is never called (outside it), and the answer is the math path's either way
    calls = _counting(monkeypatch, None)
    for causal in (False, True):
        out, lse = attend(*_inputs(causal))
        ref, ref_lse = attend_math(*_inputs(causal))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert bool(calls) is private_ops_tested()


def test_untested_torch_never_calls_private_ops(monkeypatch) -> None:
    calls = _counting(monkeypatch, RuntimeError("must not run"))
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    before = attention_fallbacks()
    out, lse = attend(*_inputs(True))
    ref, ref_lse = attend_math(*_inputs(True))
    assert not calls and attention_fallbacks() == before
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)


def test_a_failing_call_falls_back_for_that_call_only(monkeypatch, caplog) -> None:
    if not private_ops_tested():
        pytest.skip("this torch takes the public path only")
    attend_mod.cpu_flash_takes_gqa()  # the probe's verdict first (it would count a call)
    calls = _counting(monkeypatch, RuntimeError("kernel gone"))
    before = attention_fallbacks().get("cpu flash attention", 0)
    with caplog.at_level(logging.WARNING, logger="genrec.model.grid_attention"):
        for _ in range(2):
            out, lse = attend(*_inputs(False))
            ref, ref_lse = attend_math(*_inputs(False))
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(lse, ref_lse)
    assert len(calls) == 2  # tried at each call: not switched off for the process
    assert attention_fallbacks()["cpu flash attention"] == before + 2
    warned = [r for r in caplog.records if "kernel gone" in r.getMessage()]
    assert len(warned) == (1 if before == 0 else 0)  # logged once per process
    # the kernel back: the next call takes it again
    calls = _counting(monkeypatch, None)
    attend(*_inputs(False))
    assert calls and attention_fallbacks()["cpu flash attention"] == before + 2


def test_out_of_memory_is_raised_not_hidden(monkeypatch) -> None:
    if not private_ops_tested():
        pytest.skip("this torch takes the public path only")
    attend_mod.cpu_flash_takes_gqa()
    _counting(monkeypatch, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    with pytest.raises(torch.OutOfMemoryError):
        attend(*_inputs(True))


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_output_only_path_matches(with_mask: bool, causal: bool) -> None:
    q, k, v, mask, _, scale = _inputs(causal)
    mask = mask if with_mask else None
    ref, _ = attend_math(q, k, v, mask, causal, scale)
    torch.testing.assert_close(attend_output(q, k, v, mask, causal, scale), ref,
                               atol=1e-5, rtol=1e-5)
