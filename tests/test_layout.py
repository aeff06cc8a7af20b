"""Attention layout construction."""

from __future__ import annotations

import pytest
import torch

from genrec.model import build_layout


def test_packing_order_and_positions() -> None:
    # Two requests: prefix 3 with branches of 2 and 1; prefix 2 with one branch of 3.
    lay = build_layout([3, 2], [0, 0, 1], [2, 1, 3])
    assert lay.num_tokens == 11
    assert lay.prefix_tokens.tolist() == [0, 1, 2, 6, 7]
    assert lay.branch_tokens.tolist() == [3, 4, 5, 8, 9, 10]
    assert lay.positions.tolist() == [0, 1, 2, 3, 4, 3, 0, 1, 2, 3, 4]
    assert lay.prefix_causal and lay.branch_causal
    assert lay.shared_width == 3 and lay.branch_width == 3
    assert lay.shared_mask is not None  # prefixes of different lengths are padded
    assert lay.shared_empty is None


def test_cached_tokens_continue_positions() -> None:
    lay = build_layout([0, 0], [0, 0, 1], [1, 1, 1], prefix_cached=[5, 7], branch_cached=[2, 2, 2])
    assert lay.positions.tolist() == [7, 7, 9]
    assert lay.branch_slots.tolist() == [2, 5, 8]  # b * cap(3) + cached
    assert not lay.branch_causal and lay.branch_mask.shape == (3, 1, 1, 3)


def test_rejects_unsorted_branches() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        build_layout([1, 1], [1, 0], [1, 1])


def test_rejects_negative_lengths() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        build_layout([-1], [], [])


def test_to_moves_tensors() -> None:
    lay = build_layout([2], [0], [1]).to("cpu")
    assert isinstance(lay.positions, torch.Tensor)
    mask = lay.additive_mask("shared_mask", torch.float32)
    assert mask is None


def test_shared_layout_is_memoised_for_small_layouts_only() -> None:
    from genrec.model.layout import SHARED_LAYOUT_MAX_TOKENS, shared_layout

    a = shared_layout([3, 2], [0, 0, 1], [2, 1, 4])
    b = shared_layout((3, 2), torch.tensor([0, 0, 1]), [2, 1, 4])
    assert a is b  # lists, tuples and tensors of the same lengths share one layout
    ref = build_layout([3, 2], [0, 0, 1], [2, 1, 4])
    for name, value in ref.__dict__.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, getattr(a, name)), name
    assert shared_layout([3, 2], [0, 0, 1], [2, 1, 5]) is not a
    big = [SHARED_LAYOUT_MAX_TOKENS + 1]
    assert shared_layout(big, [], []) is not shared_layout(big, [], [])
