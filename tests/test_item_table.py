"""ItemTable: shapes, virtual tokens, validation."""

from __future__ import annotations

import pytest
import torch

from genrec.catalog.item_table import ItemTable


def test_tokens_and_rows() -> None:
    table = ItemTable(torch.arange(24, dtype=torch.float32).view(3, 2, 4))
    tokens = table.item_tokens([2, 0], vocab_size=100)
    assert tokens.tolist() == [[104, 105], [100, 101]]
    expected = torch.stack([table.vectors[2, 0], table.vectors[2, 1], table.vectors[0, 0],
                            table.vectors[0, 1]])
    assert torch.equal(table.rows(tokens.reshape(-1) - 100), expected)
    shape = (table.num_items, table.tokens_per_item, table.hidden_size, table.num_rows)
    assert shape == (3, 2, 4, 6)


def test_validation() -> None:
    with pytest.raises(ValueError, match="num_items, k, hidden"):
        ItemTable(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="NaN"):
        ItemTable(torch.full((1, 1, 2), float("nan")))
    with pytest.raises(ValueError, match="item id 3 is outside"):
        ItemTable(torch.zeros(3, 1, 2)).item_tokens([3], 10)
