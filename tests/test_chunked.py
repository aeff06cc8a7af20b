"""Branch chunking of a packed batch."""

from __future__ import annotations

from genrec.engine.chunked import branch_chunks


def test_chunks_respect_the_budget_and_cover_every_branch() -> None:
    assert branch_chunks([3, 3, 3, 3], 6) == [(0, 2), (2, 4)]
    assert branch_chunks([10, 1, 1], 4) == [(0, 1), (1, 3)]  # an oversized branch goes alone
    assert branch_chunks([], 4) == []
    assert branch_chunks([1] * 5, 100) == [(0, 5)]
