"""Residual k-means: the codebooks behind Semantic IDs built from item embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class ResidualKMeans:
    """Output of :func:`residual_kmeans`: codes int64 [n, levels], codebooks[l] [K_l, dim]."""

    codes: torch.Tensor
    codebooks: list[torch.Tensor]

    def reconstruct(self, levels: int | None = None) -> torch.Tensor:
        """Sum of the first ``levels`` (default all) assigned centroids: [n, dim]."""
        levels = len(self.codebooks) if levels is None else levels
        out = torch.zeros(self.codes.shape[0], self.codebooks[0].shape[1],
                          device=self.codebooks[0].device)
        for level in range(levels):
            out += self.codebooks[level][self.codes[:, level]]
        return out


def _nearest(x: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid and squared distance of each row of x: [n, d], [k, d] -> [n], [n]."""
    c2 = (centroids * centroids).sum(dim=1)
    chunk = max(1, 2**24 // max(1, centroids.shape[0]))
    assign, dist = [], []
    for start in range(0, x.shape[0], chunk):
        xs = x[start : start + chunk]
        # [chunk, k] squared distances
        d2 = (xs * xs).sum(dim=1, keepdim=True) - 2 * xs @ centroids.T + c2
        best = d2.min(dim=1)
        assign.append(best.indices)
        dist.append(best.values.clamp(min=0))
    return torch.cat(assign), torch.cat(dist)


def _init_centroids(x: torch.Tensor, k: int, gen: torch.Generator, init: str) -> torch.Tensor:
    n = x.shape[0]
    if init == "random":
        return x[torch.randperm(n, generator=gen)[:k].to(x.device)].clone()
    if init != "kmeans++":
        raise ValueError(f"init must be 'kmeans++' or 'random', got {init!r}")
    x2 = (x * x).sum(dim=1)

    def dist2(c: torch.Tensor) -> torch.Tensor:  # [d] -> [n] squared distances
        return (x2 - 2 * (x @ c) + c @ c).clamp(min=0)

    centroids = torch.empty(k, x.shape[1], dtype=x.dtype, device=x.device)
    centroids[0] = x[int(torch.randint(n, (1,), generator=gen))]
    d2 = dist2(centroids[0])
    for j in range(1, k):
        # sample a point with probability proportional to its squared distance
        cum = torch.cumsum(d2, dim=0)
        target = torch.rand(1, generator=gen).to(x.device) * cum[-1]
        idx = torch.searchsorted(cum, target, right=True).clamp(max=n - 1)
        centroids[j] = x[idx[0]]
        d2 = torch.minimum(d2, dist2(centroids[j]))
    return centroids


def kmeans(
    x: torch.Tensor, k: int, iters: int = 50, seed: int = 0, init: str = "kmeans++"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means on x [n, d]: returns centroids [k, d] and assignments int64 [n].

    At most ``iters`` iterations (stops early once assignments are stable); empty clusters are
    re-seeded with the points farthest from their centroid. With ``n <= k`` each point is its
    own cluster and the unused centroids stay zero.
    """
    n = x.shape[0]
    if n <= k:
        centroids = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device)
        centroids[:n] = x
        return centroids, torch.arange(n, device=x.device)
    gen = torch.Generator().manual_seed(seed)
    centroids = _init_centroids(x, k, gen, init)
    assign, d2 = _nearest(x, centroids)
    for _ in range(iters):
        counts = torch.bincount(assign, minlength=k)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        centroids = sums / counts.clamp(min=1)[:, None].to(x.dtype)
        empty = (counts == 0).nonzero().flatten()
        if empty.numel():
            centroids[empty] = x[d2.topk(empty.numel()).indices]
        new_assign, d2 = _nearest(x, centroids)
        if empty.numel() == 0 and torch.equal(new_assign, assign):
            break
        assign = new_assign
    return centroids, assign


def residual_kmeans(
    embeddings: torch.Tensor,
    codebook_sizes: Sequence[int],
    iters: int = 50,
    seed: int = 0,
    init: Literal["kmeans++", "random"] = "kmeans++",
) -> ResidualKMeans:
    """k-means on the embeddings, then on the residuals, once per codebook size."""
    residual = embeddings.detach().to(torch.float32).clone()
    codes, books = [], []
    for level, k in enumerate(codebook_sizes):
        centroids, assign = kmeans(residual, int(k), iters=iters, seed=seed + level, init=init)
        residual -= centroids[assign]
        codes.append(assign)
        books.append(centroids)
    return ResidualKMeans(torch.stack(codes, dim=1), books)
