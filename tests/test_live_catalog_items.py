"""Which catalog an upsert item goes to, and the checks made before any state is built."""

from __future__ import annotations

import pytest

from genrec.live_catalog.items import check_items, split_items


def test_split_sends_semantic_ids_to_the_generative_catalog_and_the_rest_to_the_ranker() -> None:
    items = [{"item_id": 1, "semantic_id": [0, 1]}, {"item_id": 2, "text": "lamp"},
             {"item_id": 3, "semantic_id": [1, 1], "text": "desk"}]
    sids, ranker = split_items(items)
    assert sids == [(1, [0, 1]), (2, None), (3, [1, 1])]
    assert ranker == [{"item_id": 2, "text": "lamp"}, {"item_id": 3, "text": "desk"}]


def test_duplicate_ids_are_named() -> None:
    with pytest.raises(ValueError, match=r"items\[2\]\.item_id: item 5 is given twice"):
        split_items([{"item_id": 5}, {"item_id": 6}, {"item_id": 5}])


@pytest.mark.parametrize(("item", "generative", "ranker", "message"), [
    ({"item_id": 1, "semantic_id": [0]}, False, True, r"items\[0\]\.semantic_id"),
    ({"item_id": 1, "text": "lamp"}, True, False, r"items\[0\]: no ranker catalog"),
    ({"item_id": 1}, True, False, r"items\[0\]: no ranker catalog"),
])
def test_what_the_server_cannot_do(item: dict, generative: bool, ranker: bool,
                                   message: str) -> None:
    with pytest.raises(LookupError, match=message):
        check_items([item], generative, ranker)


def test_what_it_can_do_passes() -> None:
    check_items([{"item_id": 1, "semantic_id": [0]}], generative=True, ranker=False)
    check_items([{"item_id": 1, "text": "lamp"}], generative=False, ranker=True)
