"""KV cache: transient caches keep fully written parts without zero-filling them."""

from __future__ import annotations

import torch

from genrec.model import build_layout
from genrec.model.beam_step import BeamStepLayout
from genrec.model.kv_cache import KVCache

H, HKV, D = 4, 2, 8


def test_transient_cache_keeps_rows_and_serves_later_chunks() -> None:
    torch.manual_seed(3)
    p, nb, n = 5, 2, 3
    q, k, v = torch.randn(p + nb * n, H, D), torch.randn(p + nb * n, HKV, D), torch.randn(
        p + nb * n, HKV, D)
    lay = build_layout([p], [0] * nb, [n] * nb)
    cache = KVCache(1, 1, p, nb, n, HKV, D, torch.float32, "cpu", transient=True)
    pk, pv, bk, bv = lay.write_cache(cache, 0, k, v)
    assert torch.equal(pk[0], k[:p]) and torch.equal(bv.reshape(-1, HKV, D), v[p:])
    ref = lay.attend(q, pk, pv, bk, bv, D**-0.5)
    # a later chunk of one more branch against the cached prefix (fresh branch storage)
    part = cache.requests(0, 1)
    part.reset_branches(1, n)
    later = build_layout([0], [0], [n], prefix_cached=[p], prefix_cap=p)
    rows = slice(p, p + n)
    out = later.attend(q[rows], *later.write_cache(part, 0, k[rows], v[rows]), D**-0.5)
    assert (out - ref[rows]).abs().max().item() < 1e-5
    assert part.branch_k[0].shape == (1, n, HKV, D)


def test_persistent_cache_starts_zeroed_and_a_beam_step_writes_its_slot_in_place() -> None:
    cache = KVCache(2, 1, 4, 3, 2, HKV, D, torch.float32, "cpu")
    assert all(not t.any() for t in cache.branch_k + cache.prefix_v)
    storage = cache.branch_k[1].data_ptr()
    ancestry = torch.arange(3)[:, None].repeat(1, 2)
    k = torch.arange(3.0)[:, None, None].expand(3, HKV, D)
    BeamStepLayout(torch.tensor([4]), ancestry, 3, 2, 2).write_cache(cache, 1, k, k + 1)
    assert cache.branch_k[1][:, 1, 0, 0].tolist() == [0.0, 1.0, 2.0]
    assert cache.branch_v[1][:, 1, 0, 0].tolist() == [1.0, 2.0, 3.0]
    assert not cache.branch_k[1][:, 0].any() and not cache.branch_k[0].any()
    assert cache.branch_k[1].data_ptr() == storage
