"""``/v1/completions`` prompt parsing: token ids and Semantic-ID text to history items."""

from __future__ import annotations

import pytest
from serving_support import tiny_engine

from genrec.serving.completions import item_text, parse_prompt
from genrec.vocab.sid_vocab import BOS_ID


def test_token_ids_and_text_give_the_same_items() -> None:
    catalog = tiny_engine().catalog
    offsets = catalog.level_offsets
    codes = catalog.codes_of([4, 9])
    ids = [BOS_ID] + [int(c) + offsets[lv] for row in codes for lv, c in enumerate(row)]
    assert parse_prompt(catalog, ids, None) == ([4, 9], None)
    text = f"{item_text(catalog, 4)} {item_text(catalog, 9)}"
    assert parse_prompt(catalog, text, None) == ([4, 9], None)


@pytest.mark.parametrize("token", [-1, 2**64, 10**6])
def test_token_ids_out_of_any_range_are_named(token: int) -> None:
    catalog = tiny_engine().catalog
    with pytest.raises(ValueError, match=f"prompt: token id {token} is not a Semantic-ID"):
        parse_prompt(catalog, [BOS_ID, token, token, token], None)
