"""Cascade attention against a dense masked reference, incremental caches, kernels."""

from __future__ import annotations

import pytest
import torch

from genrec.model import attention, build_layout, packed_layout
from genrec.model.beam_step import BeamStepLayout, advance_ancestry
from genrec.model.grid_attention import attend, attend_math
from genrec.model.kv_cache import KVCache

pytestmark = pytest.mark.numerics

H, HKV, D = 4, 2, 8


def _dense_reference(q, k, v, allowed):
    # q [T, H, D], k/v [T, HKV, D], allowed [T, T] bool
    k = k.repeat_interleave(H // HKV, 1)
    v = v.repeat_interleave(H // HKV, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * D**-0.5
    s = s.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


def _allowed(prefixes, branches):
    # Dense mask of the layout rule, in packing order.
    owners = []  # (request, branch or -1, index)
    for r, (p, bs) in enumerate(zip(prefixes, branches, strict=False)):
        owners += [(r, -1, i) for i in range(p)]
        for b, n in enumerate(bs):
            owners += [(r, b, i) for i in range(n)]
    t = len(owners)
    allowed = torch.zeros(t, t, dtype=torch.bool)
    for qi, (rq, bq, iq) in enumerate(owners):
        for ki, (rk, bk, ik) in enumerate(owners):
            if rq != rk:
                continue
            if bk == -1 and (bq != -1 or ik <= iq):
                allowed[qi, ki] = True
            elif bk == bq and bk != -1 and ik <= iq:
                allowed[qi, ki] = True
    return allowed


@pytest.mark.parametrize("transient", [False, True])
@pytest.mark.parametrize("math_path", [False, True])
@pytest.mark.parametrize(
    ("prefixes", "branches"),
    [([7], [[3, 1, 4]]), ([5, 0, 9], [[2], [3, 3], [1, 1, 5]]), ([4, 6], [[1], [2, 2]]),
     # dense: equal prefixes and equal branch tokens per request (grids are the packed rows)
     ([5, 5, 5], [[2, 2], [1, 3], [4]]), ([3, 3], [[2, 2], [2, 2]]),
     # one request, equal branches: a transient cache keeps the rows without zero-filling
     ([6], [[3, 3, 3]]), ([0], [[2, 2]]),
     # runs longer than the native kernel's tile of 64 query rows
     ([150], [[70, 3]])],
)
def test_matches_dense_mask(
    prefixes, branches, math_path: bool, transient: bool, attention_path: str
) -> None:
    torch.manual_seed(0)
    req = [r for r, bs in enumerate(branches) for _ in bs]
    lay = build_layout(prefixes, req, [n for bs in branches for n in bs])
    dense = len(set(prefixes)) == 1 and len({sum(bs) for bs in branches}) == 1
    assert lay.prefix_dense == lay.shared_dense == dense or len(prefixes) == 1
    t = lay.num_tokens
    q, k, v = torch.randn(t, H, D), torch.randn(t, HKV, D), torch.randn(t, HKV, D)
    for x in (q, k, v):  # gradients route attention through the portable math path
        x.requires_grad_(math_path)
    cache = KVCache(1, lay.num_requests, lay.prefix_cap, lay.num_branches, lay.branch_cap,
                    HKV, D, torch.float32, "cpu", transient=transient)
    out = lay.attend(q, *lay.write_cache(cache, 0, k, v), D**-0.5)
    allowed = _allowed(prefixes, branches)
    ref = _dense_reference(q.detach(), k.detach(), v.detach(), allowed)
    assert (out - ref).abs().max().item() < 1e-5
    if math_path:  # the gradients reach q, k and v through the cache as in the reference
        weight = torch.randn_like(ref)
        (out * weight).sum().backward()
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        (_dense_reference(*leaves, allowed) * weight).sum().backward()
        for x, leaf in zip((q, k, v), leaves, strict=True):
            assert (x.grad - leaf.grad).abs().max().item() < 1e-5


def test_beam_steps_read_tails_through_the_ancestry(attention_path: str) -> None:
    # 2 requests x 3 beams, 3 steps: beam b's level-j key sits in row ancestry[b, j], slot j;
    # each step must equal a dense softmax over its prefix and the keys its ancestry names.
    torch.manual_seed(1)
    n_req, width, steps, cap = 2, 3, 3, 7
    lens = torch.tensor([5, 7])
    nb = n_req * width
    pk, pv = torch.randn(n_req, cap, HKV, D), torch.randn(n_req, cap, HKV, D)
    cache = KVCache(1, n_req, cap, nb, steps, HKV, D, torch.float32, "cpu")
    cache.prefix_k[0].copy_(pk)
    cache.prefix_v[0].copy_(pv)
    g = torch.Generator().manual_seed(4)
    ancestry = torch.arange(nb)[:, None].repeat(1, steps)
    for s in range(steps):
        if s:  # beams take parents inside their request
            parent = torch.randint(0, width, (nb,), generator=g) + torch.arange(nb) // width * width
            ancestry = advance_ancestry(ancestry, parent, s)
        q, k, v = torch.randn(nb, H, D), torch.randn(nb, HKV, D), torch.randn(nb, HKV, D)
        lay = BeamStepLayout(lens, ancestry, width, s + 1, steps)
        assert lay.positions().tolist() == [int(lens[b // width]) + s for b in range(nb)]
        out = lay.attend(q, *lay.write_cache(cache, 0, k, v), D**-0.5)
        for b in range(nb):
            r, n = b // width, int(lens[b // width])
            own = [ancestry[b, j] for j in range(s + 1)]
            keys = torch.cat([pk[r, :n], torch.stack([cache.branch_k[0][a, j]
                                                      for j, a in enumerate(own)])])
            vals = torch.cat([pv[r, :n], torch.stack([cache.branch_v[0][a, j]
                                                      for j, a in enumerate(own)])])
            ref = _dense_reference(torch.cat([q[b : b + 1], torch.zeros(len(keys) - 1, H, D)]),
                                   keys, vals, torch.ones(len(keys), len(keys), dtype=torch.bool))
            assert (out[b] - ref[0]).abs().max() < 1e-5
        assert torch.equal(cache.branch_k[0][:, s], k)  # written in place, own row


def test_chunked_prefix_mask(attention_path: str) -> None:
    torch.manual_seed(2)
    q, k, v = torch.randn(10, H, D), torch.randn(10, HKV, D), torch.randn(10, HKV, D)
    full = build_layout([10], [], [])
    cache = KVCache(1, 1, 10, 0, 0, HKV, D, torch.float32, "cpu")
    ref = full.attend(q, *full.write_cache(cache, 0, k, v), D**-0.5)
    cache = KVCache(1, 1, 10, 0, 0, HKV, D, torch.float32, "cpu")
    first = build_layout([4], [], [], prefix_cap=10)
    first.attend(q[:4], *first.write_cache(cache, 0, k[:4], v[:4]), D**-0.5)
    second = build_layout([6], [], [], prefix_cached=[4])
    assert not second.prefix_causal
    out = second.attend(q[4:], *second.write_cache(cache, 0, k[4:], v[4:]), D**-0.5)
    assert (out - ref[4:]).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_kernel_matches_math_path(causal: bool) -> None:
    torch.manual_seed(3)
    q, k, v = torch.randn(2, H, 9, D), torch.randn(2, HKV, 9, D), torch.randn(2, HKV, 9, D)
    mask = torch.zeros(2, 1, 1, 9)
    mask[1, ..., 6:] = float("-inf")
    o1, l1 = attend(q, k, v, mask, causal, 0.3)
    o2, l2 = attend_math(q, k, v, mask, causal, 0.3, chunk=4)
    assert (o1 - o2).abs().max() < 1e-5 and (l1 - l2).abs().max() < 1e-5


def test_runs_over_the_key_limit_take_the_pytorch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # a run seeing more keys than the native kernel's buffer bound falls back, same result
    torch.manual_seed(4)
    prefixes, branches = [12], [[3, 5]]
    lay = build_layout(prefixes, [0, 0], [3, 5])
    q, k, v = torch.randn(lay.num_tokens, H, D), torch.randn(lay.num_tokens, HKV, D), \
        torch.randn(lay.num_tokens, HKV, D)
    monkeypatch.setattr(packed_layout, "RUN_MAX_KEYS", 4)
    monkeypatch.setattr(attention, "cascade_attention_op", lambda: pytest.fail("kernel used"))
    monkeypatch.setattr(attention, "fuses_queries", lambda q: True)
    cache = KVCache(1, 1, lay.prefix_cap, 2, lay.branch_cap, HKV, D, torch.float32, "cpu")
    out = lay.attend(q, *lay.write_cache(cache, 0, k, v), D**-0.5)
    ref = _dense_reference(q, k, v, _allowed(prefixes, branches))
    assert (out - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_fused_branch_attention_merges_like_the_portable_one(
        monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    # the CUDA branch path (prefix through the fused kernel, own keys apart, merged by
    # log-sum-exp) with the math path standing in for the kernel, against the one-softmax path;
    # a request without prefix keys (used 0) included
    from genrec.model import beam_step

    monkeypatch.setattr(beam_step, "attend", beam_step.attend_math)
    torch.manual_seed(5)
    n_req, width, n_q, cap = 3, 4, 3 if causal else 1, 9
    nb = n_req * width
    used = torch.tensor([9, 0, 4])
    q = torch.randn(nb * n_q, H, D)
    pk, pv = torch.randn(n_req, cap, HKV, D), torch.randn(n_req, cap, HKV, D)
    ok, ov = torch.randn(nb, n_q if causal else 2, HKV, D), torch.randn(nb, n_q if causal else 2,
                                                                        HKV, D)
    want = beam_step.branch_attention_portable(q, pk, pv, used, ok, ov, width, causal, 0.3)
    got = beam_step._branch_attention_fused(q, pk, pv, used, ok, ov, width, causal, 0.3)
    assert (got - want).abs().max() < 1e-5


def test_attend_math_stays_fp32_under_bf16_autocast() -> None:
    # training under --precision bf16: a bf16 score product would overflow the fp32 floor of
    # the row maxima ("value cannot be converted to type c10::BFloat16 without overflow")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, generator=g) for _ in range(3))
    for mask, causal in ((None, True), (torch.zeros(1, 1, 6, 6), False)):
        ref_out, ref_lse = attend_math(q, k[:, :2], v[:, :2], mask, causal, 0.3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, lse = attend_math(q, k[:, :2], v[:, :2], mask, causal, 0.3)
        assert out.dtype == torch.float32 and lse.dtype == torch.float32
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(lse, ref_lse)
