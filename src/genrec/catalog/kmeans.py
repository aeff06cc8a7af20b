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


def squared_distances(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Squared distance of each row of x to each centroid: [n, d], [k, d] -> [n, k] (as
    ``|x|^2 - 2 x.c + |c|^2``; every assignment to the nearest code computes it so)."""
    c2 = (centroids * centroids).sum(dim=1)
    return (x * x).sum(dim=1, keepdim=True) - 2 * x @ centroids.T + c2


def nearest_centroids(x: torch.Tensor, centroids: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid and squared distance of each row of x: [n, d], [k, d] -> [n], [n]."""
    chunk = max(1, 2**24 // max(1, centroids.shape[0]))
    assign, dist = [], []
    for start in range(0, x.shape[0], chunk):
        best = squared_distances(x[start : start + chunk], centroids).min(dim=1)
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


# preferences kept per point by the balanced assignment (the nearest centroids, in order)
BALANCED_CHOICES = 32


def balanced_assign(x: torch.Tensor, centroids: torch.Tensor, capacity: int) -> torch.Tensor:
    """Each row of x [n, d] to a centroid [k, d], no centroid taking more than ``capacity``
    rows (``capacity * k >= n``): rounds in which every unassigned row proposes to its nearest
    centroid not yet tried, and each centroid keeps its closest proposers up to what it has
    left. A row that tried its :data:`BALANCED_CHOICES` nearest goes to the nearest centroid
    with room. Returns int64 [n]."""
    n, k = x.shape[0], centroids.shape[0]
    if capacity * k < n:
        raise ValueError(f"capacity {capacity} x {k} centroids < {n} rows")
    m = min(k, BALANCED_CHOICES)
    prefs, pref_d2 = [], []
    chunk = max(1, 2**24 // max(1, k))
    for start in range(0, n, chunk):
        xs = x[start : start + chunk]
        d2 = squared_distances(xs, centroids)  # [chunk, k]
        top = d2.topk(m, dim=1, largest=False)  # sorted nearest first
        prefs.append(top.indices)
        pref_d2.append(top.values)
    pref, pd2 = torch.cat(prefs), torch.cat(pref_d2)  # [n, m]
    assign = torch.full((n,), -1, dtype=torch.long, device=x.device)
    room = torch.full((k,), capacity, dtype=torch.long, device=x.device)
    tried = torch.zeros(n, dtype=torch.long, device=x.device)
    while True:
        todo = ((assign < 0) & (tried < m)).nonzero().flatten()
        if todo.numel() == 0:
            break
        c, d = pref[todo, tried[todo]], pd2[todo, tried[todo]]
        order = d.argsort(stable=True)
        order = order[c[order].argsort(stable=True)]  # by centroid, closest first
        cs = c[order]
        first = torch.searchsorted(cs, cs)  # start of each centroid's run in cs
        rank = torch.arange(cs.numel(), device=x.device) - first
        ok = rank < room[cs]
        assign[todo[order[ok]]] = cs[ok]
        room -= torch.bincount(cs[ok], minlength=k)
        tried[todo[order[~ok]]] += 1
    left = (assign < 0).nonzero().flatten()
    for i in left.tolist():  # rare: every preferred centroid was full
        d2 = ((x[i] - centroids) ** 2).sum(dim=1)
        d2[room <= 0] = float("inf")
        j = int(d2.argmin())
        assign[i], room[j] = j, room[j] - 1
    return assign


def kmeans(
    x: torch.Tensor, k: int, iters: int = 50, seed: int = 0, init: str = "kmeans++",
    balanced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means on x [n, d]: returns centroids [k, d] and assignments int64 [n].

    At most ``iters`` iterations (stops early once assignments are stable); empty clusters are
    re-seeded with the points farthest from their centroid. With ``n <= k`` each point is its
    own cluster and the unused centroids stay zero. ``balanced``: every cluster holds at most
    ceil(n / k) points (:func:`balanced_assign`; every code used about equally, as OneRec's
    RQ-Kmeans).
    """
    n = x.shape[0]
    if n <= k:
        centroids = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device)
        centroids[:n] = x
        return centroids, torch.arange(n, device=x.device)
    gen = torch.Generator().manual_seed(seed)
    centroids = _init_centroids(x, k, gen, init)
    if balanced:
        return _balanced_lloyd(x, centroids, iters)
    assign, d2 = nearest_centroids(x, centroids)
    for _ in range(iters):
        counts = torch.bincount(assign, minlength=k)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        centroids = sums / counts.clamp(min=1)[:, None].to(x.dtype)
        empty = (counts == 0).nonzero().flatten()
        if empty.numel():
            centroids[empty] = x[d2.topk(empty.numel()).indices]
        new_assign, d2 = nearest_centroids(x, centroids)
        if empty.numel() == 0 and torch.equal(new_assign, assign):
            break
        assign = new_assign
    return centroids, assign


def _balanced_lloyd(x: torch.Tensor, centroids: torch.Tensor,
                    iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = centroids.shape[0]
    capacity = -(-x.shape[0] // k)
    assign = balanced_assign(x, centroids, capacity)
    for _ in range(iters):
        counts = torch.bincount(assign, minlength=k)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        centroids = sums / counts.clamp(min=1)[:, None].to(x.dtype)
        new_assign = balanced_assign(x, centroids, capacity)
        if torch.equal(new_assign, assign):
            break
        assign = new_assign
    return centroids, assign


def residual_kmeans(
    embeddings: torch.Tensor,
    codebook_sizes: Sequence[int],
    iters: int = 50,
    seed: int = 0,
    init: Literal["kmeans++", "random"] = "kmeans++",
    balanced: bool = False,
) -> ResidualKMeans:
    """k-means on the embeddings, then on the residuals, once per codebook size
    (``balanced``: each level's codes used about equally, see :func:`kmeans`)."""
    residual = embeddings.detach().to(torch.float32).clone()
    codes, books = [], []
    for level, k in enumerate(codebook_sizes):
        centroids, assign = kmeans(residual, int(k), iters=iters, seed=seed + level, init=init,
                                   balanced=balanced)
        residual -= centroids[assign]
        codes.append(assign)
        books.append(centroids)
    return ResidualKMeans(torch.stack(codes, dim=1), books)
