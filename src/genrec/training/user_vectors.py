"""User vectors for the soft token, computed from TRAINING interactions only.

``svd`` factorises the binary user-item matrix of the training parts (each user's sequence
without its validation and test items) with ``torch.svd_lowrank``: a user's vector is its row of
``U * sqrt(S)``, scaled so that the mean norm over users with training items is 1. Users without
training items get zeros. Vectors can also be read from a ``.npy`` / ``.safetensors`` file
(one row per user, in the dataset's user order). The vectors used in training are saved beside
the checkpoint so evaluation and serving use exactly the same ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from genrec.catalog.embeddings import load_embeddings, save_embeddings
from genrec.training.generative import training_sequences
from genrec.utils.atomic import atomic_write_json

# .npy, not .safetensors: load_model reads every *.safetensors of a checkpoint as weights
VECTORS_FILE = "user_vectors.npy"
META_FILE = "user_vectors.json"


def svd_user_vectors(
    train_sequences: Sequence[Sequence[int]], num_items: int, dim: int, niter: int = 4,
    seed: int = 0,
) -> torch.Tensor:
    """float32 [num_users, dim] from the binary matrix of ``train_sequences`` (one per user)."""
    if dim < 1:
        raise ValueError(f"user_dim must be >= 1, got {dim}")
    n_users = len(train_sequences)
    pairs = {(u, i) for u, seq in enumerate(train_sequences) for i in seq}
    if any(not 0 <= i < num_items for _, i in pairs):
        raise ValueError(f"train_sequences: item ids must lie in 0..{num_items - 1}")
    out = torch.zeros(n_users, dim)
    if not pairs:
        return out
    index = torch.tensor(sorted(pairs), dtype=torch.int64).T  # [2, nnz]
    matrix = torch.sparse_coo_tensor(
        index, torch.ones(index.shape[1]), (n_users, num_items), check_invariants=True
    ).coalesce()
    q = min(dim, n_users, num_items)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _, s, v = torch.svd_lowrank(matrix, q=q, niter=niter)
    # U * sqrt(S) = A V S^-1/2; computed from A so that users without items stay exactly zero
    keep = s > s.max() * 1e-6
    proj = torch.sparse.mm(matrix, v[:, keep]) * s[keep].rsqrt()  # [U, q']
    out[:, : proj.shape[1]] = proj
    norms = out.norm(dim=1)
    active = norms > 0
    if bool(active.any()):
        out /= norms[active].mean()
    return out


def compute_user_vectors(
    sequences: Sequence[Sequence[int]], num_items: int, dim: int, seed: int = 0,
    min_interactions: int = 3,
) -> torch.Tensor:
    """SVD user vectors of full per-user ``sequences``, using their training parts only."""
    train = training_sequences(sequences, min_interactions)
    return svd_user_vectors(train, num_items, dim, seed=seed)


def load_user_vectors_file(path: str | Path, num_users: int) -> torch.Tensor:
    """Read user vectors [num_users, dim] from ``.npy`` or ``.safetensors``."""
    vectors = load_embeddings(path, key=None)
    if vectors.shape[0] != num_users:
        raise ValueError(f"user_vectors: {Path(path).name} has {vectors.shape[0]} rows, the "
                         f"dataset has {num_users} users")
    return vectors


def users_fingerprint(user_ids: Sequence[str]) -> str:
    """A short hash of the user order the vectors' rows follow."""
    return hashlib.sha256("\n".join(user_ids).encode()).hexdigest()[:16]


def save_user_vectors(
    directory: str | Path, vectors: torch.Tensor, source: str, user_ids: Sequence[str]
) -> None:
    """Write the vectors and how they were made beside a checkpoint (atomically)."""
    directory = Path(directory)
    if vectors.shape[0] != len(user_ids):
        raise ValueError(f"user_vectors: {vectors.shape[0]} rows for {len(user_ids)} users")
    save_embeddings(directory / VECTORS_FILE, vectors)
    atomic_write_json(directory / META_FILE, {
        "source": source, "dim": int(vectors.shape[1]), "num_users": len(user_ids),
        "users_sha256": users_fingerprint(user_ids),
    })


def load_saved_user_vectors(
    directory: str | Path, user_ids: Sequence[str] | None = None
) -> torch.Tensor | None:
    """The vectors saved by :func:`save_user_vectors`, or None when the checkpoint has none.

    With ``user_ids`` the saved user order is checked against the dataset's.
    """
    directory = Path(directory)
    if not (directory / VECTORS_FILE).is_file():
        return None
    meta = json.loads((directory / META_FILE).read_text())
    if user_ids is not None and meta.get("users_sha256") != users_fingerprint(user_ids):
        raise ValueError(f"user_vectors: {directory / META_FILE} was saved for a different set "
                         f"or order of users ({meta.get('num_users')} users) than this dataset "
                         f"({len(user_ids)} users)")
    return load_embeddings(directory / VECTORS_FILE)


def resolve_user_vectors(
    source: str, sequences: Sequence[Sequence[int]], num_items: int, dim: int, seed: int = 0,
) -> torch.Tensor | None:
    """``"none"`` -> None, ``"svd"`` -> :func:`compute_user_vectors`, else a file path."""
    if source == "none":
        return None
    if source == "svd":
        return compute_user_vectors(sequences, num_items, dim, seed=seed)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--user-vectors: expected 'svd', 'none' or a file, got {source!r}")
    return load_user_vectors_file(path, len(sequences))
