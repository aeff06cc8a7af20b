"""SVD user vectors from training interactions only; saving beside a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genrec.training.user_vectors import (
    compute_user_vectors,
    fold_in,
    load_saved_user_vectors,
    load_user_vectors_file,
    resolve_user_vectors,
    save_user_vectors,
    svd_item_factors,
    svd_user_vectors,
)

N_ITEMS = 40


def clustered(n_users: int = 24, seed: int = 0) -> list[list[int]]:
    """Users of cluster c (= u % 4) pick items from c*10 .. c*10+9."""
    g = torch.Generator().manual_seed(seed)
    return [(u % 4 * 10 + torch.randperm(10, generator=g)[:6]).tolist() for u in range(n_users)]


def test_shape_scale_and_cluster_structure() -> None:
    seqs = clustered()
    vec = svd_user_vectors(seqs, N_ITEMS, dim=8)
    assert vec.shape == (24, 8) and vec.dtype == torch.float32
    assert vec.norm(dim=1).mean() == pytest.approx(1.0, rel=1e-5)
    unit = torch.nn.functional.normalize(vec, dim=1)
    sim = unit @ unit.T
    same = torch.tensor([[a % 4 == b % 4 for b in range(24)] for a in range(24)])
    assert sim[same].mean() > sim[~same].mean() + 0.5


def test_fold_in_is_u_sqrt_s_of_the_training_matrix() -> None:
    seqs = clustered()
    factors = svd_item_factors(seqs, N_ITEMS, dim=4, niter=8)
    vec = fold_in(factors, seqs)
    assert torch.equal(vec, svd_user_vectors(seqs, N_ITEMS, dim=4, niter=8))
    dense = torch.zeros(len(seqs), N_ITEMS)
    for u, seq in enumerate(seqs):
        dense[u, seq] = 1.0
    u_, s_, _ = torch.linalg.svd(dense, full_matrices=False)
    ref = u_[:, :4] * s_[:4].sqrt()  # the 4 clusters' dimensions
    ref = ref / ref.norm(dim=1).mean()
    # equal up to a rotation inside the subspace: compare the users' Gram matrices
    assert torch.allclose(vec @ vec.T, ref @ ref.T, atol=1e-3)
    assert torch.equal(fold_in(factors, [[]]), torch.zeros(1, 4))
    assert torch.allclose(fold_in(factors, [[3, 3, 5]])[0], factors[3] + factors[5])


def test_causal_windows_hold_none_of_their_targets() -> None:
    from genrec.catalog.semantic_ids import SemanticIndex
    from genrec.training.generative_task import GenerativeTask
    from genrec.training.windows import make_windows
    from genrec.vocab.sid_vocab import SidVocab

    seqs = clustered()
    codes = torch.stack([torch.arange(N_ITEMS) // 8, torch.arange(N_ITEMS) % 8], dim=1)
    vocab = SidVocab(SemanticIndex(codes, [8, 8]), max_history=2)
    factors = svd_item_factors(seqs, N_ITEMS, dim=4)
    task = GenerativeTask(vocab, seqs, fold_in(factors, seqs), batch_tokens=50,
                          item_factors=factors, progress=False)
    first = [k for k, u in enumerate(task.users) if u == 0]
    seq = seqs[0]  # 6 distinct items; windows of up to 3 items, tiled from the end
    windows = make_windows(seq, 2)
    assert len(first) == len(windows) == 3
    for k, window in zip(first, windows, strict=True):
        start = seq.index(window[0])
        assert not set(window[1:]) & set(seq[: start + 1])  # no target in the vector
        assert torch.allclose(task.window_vectors[k], fold_in(factors, [seq[: start + 1]])[0])
    batch = next(task.batches(0))
    assert batch.user_vectors.shape == (len(batch.lengths), 4)
    plain = GenerativeTask(vocab, seqs, fold_in(factors, seqs), batch_tokens=50, progress=False)
    assert plain.window_vectors is None


def test_users_without_training_items_get_zeros() -> None:
    seqs = clustered()
    seqs[3] = []
    vec = svd_user_vectors(seqs, N_ITEMS, dim=4)
    assert torch.equal(vec[3], torch.zeros(4))
    # only 2 items in total -> rank 2: the extra dimensions are zero
    assert torch.equal(svd_user_vectors([[0, 1], [1]], N_ITEMS, dim=5)[:, 2:], torch.zeros(2, 3))


def test_held_out_items_do_not_leak() -> None:
    seqs = clustered()
    vec = compute_user_vectors(seqs, N_ITEMS, dim=6)
    changed = [s[:-2] + [39 - s[-2], (s[-1] + 17) % N_ITEMS] for s in seqs]  # new val/test
    assert torch.equal(compute_user_vectors(changed, N_ITEMS, dim=6), vec)
    assert not torch.equal(compute_user_vectors([s[1:] for s in seqs], N_ITEMS, dim=6), vec)
    short = [[1, 2]] + seqs[1:]  # a short user is never evaluated: all of it is training data
    assert not torch.equal(compute_user_vectors(short, N_ITEMS, dim=6)[0], torch.zeros(6))


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="item ids"):
        svd_user_vectors([[0, N_ITEMS]], N_ITEMS, dim=2)
    with pytest.raises(ValueError, match="user_dim"):
        svd_user_vectors([[0]], N_ITEMS, dim=0)
    with pytest.raises(ValueError, match="--user-vectors"):
        resolve_user_vectors("nope.npy", [[0]], N_ITEMS, 2)


def test_save_load_and_user_order_check(tmp_path) -> None:
    vec = svd_user_vectors(clustered(), N_ITEMS, dim=4)
    users = [f"u{i}" for i in range(24)]
    save_user_vectors(tmp_path, vec, "svd", users)
    assert torch.equal(load_saved_user_vectors(tmp_path, users), vec)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ValueError, match="different set"):
        load_saved_user_vectors(tmp_path, users[::-1])
    assert load_saved_user_vectors(tmp_path / "missing") is None


def test_vectors_from_a_file(tmp_path) -> None:
    np.save(tmp_path / "u.npy", np.ones((3, 5), dtype=np.float32))
    assert resolve_user_vectors(str(tmp_path / "u.npy"), [[0]] * 3, N_ITEMS, 2).shape == (3, 5)
    assert resolve_user_vectors("none", [[0]] * 3, N_ITEMS, 2) is None
    with pytest.raises(ValueError, match="3 rows, the dataset has 4 users"):
        load_user_vectors_file(tmp_path / "u.npy", 4)
