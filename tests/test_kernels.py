"""The native CPU cascade kernel: built on first use, equal to dense attention, optional."""

from __future__ import annotations

import logging

import pytest
import torch

import genrec.kernels as kernels
from genrec.model import build_layout
from genrec.model.attention import QueryTransform
from genrec.model.kv_cache import KVCache
from genrec.model.layers import Rotary

pytestmark = pytest.mark.numerics


def _op():
    op = kernels.cascade_attention_op()
    if op is None:
        pytest.skip("the native CPU kernel is not built here (no C++ compiler or MKL)")
    return op


def _reference(q, keys, values, visible, scale):
    # q [T, H, D]; keys/values [T, K, Hkv, D] per query; visible [T, K] bool
    group = q.shape[1] // keys.shape[2]
    k = keys.repeat_interleave(group, 2)
    v = values.repeat_interleave(group, 2)
    s = torch.einsum("thd,tkhd->thk", q, k) * scale
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("thk,tkhd->thd", torch.softmax(s, -1), v)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(8, 2, 64), (3, 3, 16), (4, 1, 8)])
def test_runs_match_dense_attention(heads: int, kv_heads: int, dim: int) -> None:
    op = _op()
    torch.manual_seed(0)
    # two runs over shared rows 0..69 of the "prefix" source: one sees 70 shared keys and its
    # own rows 5.. of the branch source with 3 earlier own keys; one (150 rows: three tiles
    # of the engine's size would cut it) sees its own prefix rows causally
    shared = torch.randn(2, 200, kv_heads, dim)  # keys, values
    branch = torch.randn(2, 40, kv_heads, dim)
    q_rows = torch.randn(300, heads + 2, dim)[:, :heads]  # strided rows, dense heads
    runs = torch.tensor([[10, 20, 0, 70, 0, 5, 3], [100, 150, 0, 0, 1, 20, 7]])
    out = op(q_rows, shared[0], shared[1], branch[0], branch[1], runs, 0.3)
    for q0, n, s0, sl, src, o0, before in runs.tolist():
        own = shared if src else branch
        keys = torch.cat((shared[:, s0 : s0 + sl], own[:, o0 : o0 + before + n]), dim=1)
        seen = sl + before + 1 + torch.arange(n)  # keys each query sees
        visible = torch.arange(keys.shape[1])[None, :] < seen[:, None]
        ref = _reference(q_rows[q0 : q0 + n], keys[0].expand(n, -1, -1, -1),
                         keys[1].expand(n, -1, -1, -1), visible, 0.3)
        assert (out[q0 : q0 + n] - ref).abs().max().item() < 1e-5


def test_equal_alone_and_among_others() -> None:
    # a branch's output does not depend on the other runs of the call (batch invariance)
    _op()
    torch.manual_seed(1)
    lay = build_layout([9], [0] * 5, [4, 6, 3, 6, 2])
    t = lay.num_tokens
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    cache = KVCache(1, 1, lay.prefix_cap, 5, lay.branch_cap, 2, 8, torch.float32, "cpu")
    full = lay.attend(q, *lay.write_cache(cache, 0, k, v), 0.35)
    rows = list(range(9)) + list(range(9 + 4 + 6, 9 + 4 + 6 + 3))  # prefix + third branch
    alone = build_layout([9], [0], [3])
    cache = KVCache(1, 1, 9, 1, 3, 2, 8, torch.float32, "cpu")
    out = alone.attend(q[rows], *alone.write_cache(cache, 0, k[rows], v[rows]), 0.35)
    assert (out - full[rows]).abs().max().item() < 1e-6


def test_the_kernels_build_wherever_they_can() -> None:
    # a broken source must fail here, not turn every native test into a skip
    import os
    import shutil
    import sys

    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not (compiler and sys.platform.startswith("linux") and torch.backends.mkl.is_available()
            and os.environ.get("GENREC_CPU_KERNELS", "1") != "0"):
        pytest.skip("no compiler or MKL here: the PyTorch path serves")
    assert kernels.cascade_attention_op() is not None
    assert kernels.decoder_layers_op() is not None
    assert kernels.range_logprobs_op() is not None
    assert kernels.trie_expand_op() is not None


def test_disabled_or_unbuildable_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("GENREC_CPU_KERNELS", "0")
    assert kernels.cascade_attention_op() is None
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("GENREC_CPU_KERNELS", "1")
    monkeypatch.setenv("GENREC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    if not torch.backends.mkl.is_available():
        pytest.skip("no MKL: the kernel is never built")
    with caplog.at_level(logging.WARNING, logger="genrec.kernels"):
        assert kernels.cascade_attention_op() is None
    assert "PyTorch path" in caplog.text
    assert not list(tmp_path.glob("*.so"))


@pytest.mark.parametrize("norm", ["none", "eps", "row_eps"])
def test_query_norm_and_rotary_in_the_kernel(norm: str) -> None:
    # raw queries + QueryTransform in the kernel == transformed queries through it
    op = _op()
    torch.manual_seed(2)
    t, heads, kv_heads, dim = 70, 4, 2, 64
    q = torch.randn(t, heads + 4, dim)[:, :heads] * 3.0
    keys, values = torch.randn(t, kv_heads, dim), torch.randn(t, kv_heads, dim)
    cos, ssin = Rotary(dim, 10000.0).cos_sin(torch.arange(100, 100 + t), torch.float32)
    weight = torch.rand(dim) + 0.5 if norm != "none" else None
    eps = torch.rand(t) * 0.5 if norm == "row_eps" else 1e-6
    tr = QueryTransform(cos, ssin, weight, eps)
    runs = torch.tensor([[0, 40, 0, 0, 1, 0, 0], [40, 30, 0, 40, 1, 40, 0]])
    plain = op(tr.apply(q).contiguous(), keys, values, keys, values, runs, 0.125)
    fused = op(q, keys, values, keys, values, runs, 0.125, cos=cos[:, 0], sin=ssin[:, 0],
               weight=weight, row_eps=eps if norm == "row_eps" else None,
               eps=eps if norm == "eps" else 0.0)
    assert (fused - plain).abs().max().item() < 1e-5
