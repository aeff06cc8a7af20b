"""pack_requests: packing order, read-out positions, vectorised validation."""

from __future__ import annotations

import pytest
import torch

from genrec.engine.batch import RequestLimits, pack_requests
from genrec.engine.inputs import InputError

LIMITS = RequestLimits(vocab_size=20, max_positions=30, item_rows=6, user_dim=3, soft_token_id=1)


def test_packing_and_positions() -> None:
    b = pack_requests([[2, 3, 4], [1, 5]], [[[6], [7, 8]], [[9, 10, 11]]],
                      [None, torch.ones(3)], LIMITS)
    assert b.inputs.token_ids.tolist() == [2, 3, 4, 6, 7, 8, 1, 5, 9, 10, 11]
    assert b.branch_starts.tolist() == [3, 4, 8]
    assert b.prefix_last.tolist() == [2, 7]
    assert b.branch_counts == [2, 1]
    assert b.inputs.soft_rows.tolist() == [6]
    assert b.layout.positions.tolist() == [0, 1, 2, 3, 3, 4, 0, 1, 2, 3, 4]


def test_virtual_ids_up_to_table_end_are_accepted() -> None:
    pack_requests([[2]], [[[25]]], [None], LIMITS)  # 20 + 6 rows -> last valid id 25
    with pytest.raises(InputError, match=r"requests\[0\].candidates\[1\]: item token id 26"):
        pack_requests([[2]], [[[25], [26]]], [None], LIMITS)


def test_placeholder_in_candidate_rejected() -> None:
    with pytest.raises(InputError, match="candidates.0.: the soft-token placeholder"):
        pack_requests([[1]], [[[1]]], [torch.ones(3)], LIMITS)


def test_bulk_and_per_candidate_packing_agree_and_errors_name_the_candidate() -> None:
    from genrec.engine.inputs import Embeds

    cands = [[6], [7, 8], [9, 10, 11]]
    bulk = pack_requests([[2, 3]], [cands], [None], LIMITS)  # plain lists: bulk path
    mixed = pack_requests([[2, 3]], [[(6,), [7, 8], [9, 10, 11]]], [None], LIMITS)  # a tuple
    assert bulk.inputs.token_ids.tolist() == mixed.inputs.token_ids.tolist()
    assert bulk.branch_starts.tolist() == mixed.branch_starts.tolist() == [2, 3, 5]
    assert bulk.branch_lens == mixed.branch_lens == [1, 2, 3]
    assert bulk.layout.positions.tolist() == mixed.layout.positions.tolist()
    raw = pack_requests([[2]], [[[6], [Embeds(torch.zeros(2, 4)), 7]]], [None], LIMITS)
    assert raw.inputs.raw_rows.tolist() == [2, 3] and raw.branch_lens == [1, 3]
    with pytest.raises(InputError, match=r"requests\[0\].candidates\[1\]: empty candidate"):
        pack_requests([[2]], [[[6], [], [7]]], [None], LIMITS)
    with pytest.raises(InputError, match=r"requests\[0\].candidates\[2\]: negative token id"):
        pack_requests([[2]], [[[6], [7], [-3]]], [None], LIMITS)
    with pytest.raises(InputError, match=r"requests\[1\].candidates\[0\]: prefix \(2\) \+ "
                                         r"candidate \(29\) tokens exceed"):
        pack_requests([[2], [3, 4]], [[[5]], [[6] * 29]], [None, None], LIMITS)
