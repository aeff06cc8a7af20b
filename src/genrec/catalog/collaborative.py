"""Collaborative signal in Semantic IDs: items that the same users take share codes.

Text alone puts two items in one code when their descriptions are alike; items bought by the
same people may read nothing alike. ``genrec index --collaborative W`` gives the residual
k-means each item's text (or given) embedding, L2-normalised, followed by ``W`` times its
L2-normalised row of ``V S^1/2`` from a truncated SVD of the binary user-item matrix of the
training interactions (each user's items but the validation and test targets, so nothing
evaluated leaks into the IDs). An item without training interactions, and every item added
later (``--add``, catalog upserts), has zeros there: it is placed by its text alone
(:attr:`~genrec.catalog.codebooks.IdCodebooks.collaborative`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def interaction_matrix(histories: Sequence[Sequence[int]], num_items: int) -> torch.Tensor:
    """The binary sparse [len(histories), num_items] matrix of ``histories`` (item rows per
    user; repeats count once)."""
    pairs = {(u, i) for u, seq in enumerate(histories) for i in seq}
    if any(not 0 <= i < num_items for _, i in pairs):
        raise ValueError(f"train_sequences: item ids must lie in 0..{num_items - 1}")
    index = torch.tensor(sorted(pairs), dtype=torch.int64).reshape(-1, 2).T  # [2, nnz]
    return torch.sparse_coo_tensor(index, torch.ones(index.shape[1]),
                                   (len(histories), num_items), check_invariants=True).coalesce()


def interaction_svd(matrix: torch.Tensor, rank: int, niter: int, seed: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded truncated SVD of a non-empty :func:`interaction_matrix`: the singular values
    ``s`` [r] and item vectors ``v`` [num_items, r] above 1e-6 of the largest
    (``r <= min(rank, users, items)``)."""
    q = min(rank, *matrix.shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _, s, v = torch.svd_lowrank(matrix, q=q, niter=niter)
    keep = s > s.max() * 1e-6
    return s[keep], v[:, keep]


def interaction_factors(
    train_sequences: Sequence[Sequence[int]], num_items: int, dim: int, niter: int = 6,
    seed: int = 0,
) -> torch.Tensor:
    """float32 [num_items, dim]: each item's L2-normalised row of ``V S^1/2`` of the binary
    user-item matrix of ``train_sequences`` (one list of item rows per user); zeros for an
    item no user has, and past the matrix's rank."""
    if dim < 1:
        raise ValueError(f"collaborative dim: must be >= 1, got {dim}")
    factors = torch.zeros(num_items, dim)
    matrix = interaction_matrix(train_sequences, num_items)
    if matrix._nnz() == 0:
        return factors
    s, v = interaction_svd(matrix, dim, niter, seed)
    factors[:, : s.numel()] = v * s.sqrt()
    return torch.nn.functional.normalize(factors, dim=1)  # a zero row stays zero


def with_collaborative(embeddings: torch.Tensor, factors: torch.Tensor, weight: float
                       ) -> torch.Tensor:
    """[n, d + k]: ``embeddings`` [n, d] L2-normalised, then ``weight`` x ``factors`` [n, k]
    (:func:`interaction_factors`)."""
    if embeddings.shape[0] != factors.shape[0]:
        raise ValueError(f"embeddings: {embeddings.shape[0]} rows, the factors "
                         f"{factors.shape[0]}")
    if weight < 0:
        raise ValueError(f"collaborative weight: must be >= 0, got {weight}")
    text = torch.nn.functional.normalize(embeddings.to(torch.float32), dim=1)
    return torch.cat([text, weight * factors.to(text.device, torch.float32)], dim=1)
