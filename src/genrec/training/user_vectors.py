"""User vectors for the soft token, computed from TRAINING interactions only.

``svd`` factorises the binary user-item matrix of the training parts (each user's sequence
without its validation and test items) with ``torch.svd_lowrank``: a user's vector is its row of
``U * sqrt(S)``, scaled so that the mean norm over users with training items is 1. Users without
training items get zeros. That vector contains every training item, so in training it also
contains the items the model is asked to predict.

``svd-causal`` uses the same factorisation, but a vector is folded in from the items *before*
the prediction (:func:`fold_in`, the sum of the items' factors): in training, each window's
vector holds the user's items up to the window's first item (none of its targets); in
evaluation, every item before the held-out one. The item factors are saved beside the
checkpoint (:data:`FACTORS_FILE`) so that evaluation folds in the same way.

Vectors can also be read from a ``.npy`` / ``.safetensors`` file (one row per user, in the
dataset's user order). The vectors used in training are saved beside the checkpoint so
evaluation and serving use exactly the same ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from genrec.catalog.collaborative import interaction_matrix, interaction_svd
from genrec.catalog.embeddings import load_embeddings, save_embeddings
from genrec.data.split import training_sequences
from genrec.utils.atomic import atomic_write_json

# .npy, not .safetensors: load_model reads every *.safetensors of a checkpoint as weights
VECTORS_FILE = "user_vectors.npy"
META_FILE = "user_vectors.json"
FACTORS_FILE = "user_item_factors.npy"


def svd_item_factors(
    train_sequences: Sequence[Sequence[int]], num_items: int, dim: int, niter: int = 4,
    seed: int = 0,
) -> torch.Tensor:
    """float32 [num_items, dim] item factors ``V S^-1/2`` of the binary user-item matrix of
    ``train_sequences`` (one per user), scaled so that the users' vectors (:func:`fold_in`)
    have mean norm 1 over users with training items. Dimensions past the matrix's rank are 0."""
    if dim < 1:
        raise ValueError(f"user_dim must be >= 1, got {dim}")
    factors = torch.zeros(num_items, dim)
    matrix = interaction_matrix(train_sequences, num_items)
    if matrix._nnz() == 0:
        return factors
    s, v = interaction_svd(matrix, dim, niter, seed)
    factors[:, : s.numel()] = v * s.rsqrt()
    norms = torch.sparse.mm(matrix, factors).norm(dim=1)
    return factors / norms[norms > 0].mean()


def fold_in(factors: torch.Tensor, histories: Sequence[Sequence[int]]) -> torch.Tensor:
    """[len(histories), dim]: each history's vector, the sum of the factors of its distinct
    items (a user's SVD vector ``U S^1/2`` is exactly this for its training items); an empty
    history gives zeros."""
    return torch.sparse.mm(interaction_matrix(histories, factors.shape[0]), factors)


def svd_user_vectors(
    train_sequences: Sequence[Sequence[int]], num_items: int, dim: int, niter: int = 4,
    seed: int = 0,
) -> torch.Tensor:
    """float32 [num_users, dim]: each user's row of ``U * sqrt(S)`` of the binary matrix of
    ``train_sequences`` (one per user), scaled to mean norm 1 (:func:`svd_item_factors`)."""
    factors = svd_item_factors(train_sequences, num_items, dim, niter, seed)
    return fold_in(factors, train_sequences)


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


def save_item_factors(directory: str | Path, factors: torch.Tensor) -> None:
    """Write the ``svd-causal`` item factors beside a checkpoint (atomically)."""
    save_embeddings(Path(directory) / FACTORS_FILE, factors)


def load_item_factors(directory: str | Path) -> torch.Tensor | None:
    """The item factors saved by :func:`save_item_factors`, or None."""
    path = Path(directory) / FACTORS_FILE
    return load_embeddings(path) if path.is_file() else None


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


def saved_source(directory: str | Path) -> str | None:
    """How the vectors saved beside a checkpoint were made (``svd``, ``svd-causal``, a file's
    name), or None when it has none."""
    path = Path(directory) / META_FILE
    return json.loads(path.read_text()).get("source") if path.is_file() else None


def resolve_user_vectors(
    source: str, sequences: Sequence[Sequence[int]], num_items: int, dim: int, seed: int = 0,
) -> torch.Tensor | None:
    """``"none"`` -> None, ``"svd"`` -> :func:`compute_user_vectors`, else a file path
    (``svd-causal`` is built by the generative trainer: :func:`svd_item_factors`)."""
    if source == "none":
        return None
    if source == "svd":
        return compute_user_vectors(sequences, num_items, dim, seed=seed)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--user-vectors: expected 'svd', 'none' or a file, got {source!r}")
    return load_user_vectors_file(path, len(sequences))
