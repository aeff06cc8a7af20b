"""Interaction factors for Semantic IDs: items taken by the same users get the same factors,
items nobody took get zeros, and the parts are weighed after normalisation."""

from __future__ import annotations

import pytest
import torch

from genrec.catalog.collaborative import interaction_factors, with_collaborative


def test_items_of_the_same_users_share_factors_and_untaken_items_are_zero() -> None:
    # users 0-2 take items 0 and 1, users 3-5 items 2 and 3; item 4: nobody
    seqs = [[0, 1]] * 3 + [[2, 3]] * 3
    f = interaction_factors(seqs, 5, dim=8)
    assert f.shape == (5, 8)
    assert torch.allclose(f[:4].norm(dim=1), torch.ones(4)) and torch.equal(f[4], torch.zeros(8))
    assert torch.allclose(f[0], f[1], atol=1e-5) and torch.allclose(f[2], f[3], atol=1e-5)
    assert abs(float(f[0] @ f[2])) < 1e-5  # no user in common: orthogonal
    assert torch.equal(interaction_factors(seqs, 5, dim=8), f)  # seeded
    assert torch.equal(interaction_factors([[], []], 3, dim=4), torch.zeros(3, 4))


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="item ids must lie in 0..2"):
        interaction_factors([[0, 3]], 3, dim=4)
    with pytest.raises(ValueError, match="dim: must be >= 1"):
        interaction_factors([[0]], 3, dim=0)
    with pytest.raises(ValueError, match="2 rows, the factors 3"):
        with_collaborative(torch.ones(2, 4), torch.ones(3, 2), 1.0)
    with pytest.raises(ValueError, match="weight: must be >= 0"):
        with_collaborative(torch.ones(3, 4), torch.ones(3, 2), -1.0)


def test_the_weight_is_the_ratio_of_the_normalised_parts() -> None:
    emb = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    factors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = with_collaborative(emb, factors, 0.5)
    assert torch.allclose(out, torch.tensor([[0.6, 0.8, 0.5, 0.0, 0.0],
                                             [0.0, 1.0, 0.0, 0.0, 0.0]]))
