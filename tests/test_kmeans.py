"""Residual k-means: balanced assignment under a capacity, and balanced codebooks."""

from __future__ import annotations

import pytest
import torch

from genrec.catalog.kmeans import balanced_assign, kmeans, residual_kmeans
from genrec.catalog.semantic_ids import prefix_stats
from genrec.catalog.sid_sources import build_semantic_index


def _skewed(n: int = 600, d: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) ** 3  # heavy tails: plain k-means is unbalanced


def test_balanced_assign_respects_capacity_and_prefers_near_centroids() -> None:
    x = _skewed()
    centroids = x[:10].clone()
    assign = balanced_assign(x, centroids, capacity=60)
    assert (assign >= 0).all()
    assert torch.bincount(assign, minlength=10).max() <= 60
    # with room for everyone, every row takes its nearest centroid
    nearest = torch.cdist(x, centroids).argmin(dim=1)
    assert torch.equal(balanced_assign(x, centroids, capacity=600), nearest)


def test_balanced_assign_refuses_too_little_room() -> None:
    with pytest.raises(ValueError, match="capacity"):
        balanced_assign(torch.randn(11, 2), torch.randn(5, 2), capacity=2)


def test_balanced_kmeans_uses_every_code_about_equally() -> None:
    x = _skewed(1000)
    _, plain = kmeans(x, 16, seed=0)
    _, bal = kmeans(x, 16, seed=0, balanced=True)
    assert torch.bincount(bal, minlength=16).max() <= 63  # ceil(1000 / 16)
    assert torch.bincount(plain, minlength=16).max() > 63  # the data is skewed


def test_balanced_codes_separate_items_better() -> None:
    x = _skewed(2000, 8, seed=1)
    plain = build_semantic_index(x, levels=2, codebook_size=16, dedup=True)
    bal = build_semantic_index(x, levels=2, codebook_size=16, dedup=True, balanced=True)
    assert bal.meta["balanced"] and not plain.meta["balanced"]
    p, b = prefix_stats(plain.codes[:, :2]), prefix_stats(bal.codes[:, :2])
    assert b[1]["distinct"] > p[1]["distinct"]
    assert b[1]["largest_group"] < p[1]["largest_group"]
    # residual levels are balanced too
    codes = residual_kmeans(x, [16, 16], balanced=True).codes
    for level in range(2):
        assert torch.bincount(codes[:, level], minlength=16).max() <= 125

