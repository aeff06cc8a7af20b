"""An update planned on both catalogs: the generative catalog takes the items with a
Semantic ID, the ranker the others (and every retired id when there is one); nothing
installed while planning."""

from __future__ import annotations

import pytest
from logged_catalog_support import free_sids
from serving_support import N_ITEMS, tiny_engine

from genrec.catalog.id_map import IdMap
from genrec.live_catalog.update_plan import next_generative, ranker_items, run_ranker

IDS = IdMap.rows_named(N_ITEMS)


class Calls:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []

    def upsert(self, items: list[dict], ids: object = None) -> int:
        self.calls.append(("upsert", items))
        return 5

    def retire(self, item_ids: list, ids: object = None) -> int:
        self.calls.append(("retire", item_ids))
        return 6


def test_items_go_to_the_catalog_that_can_take_them() -> None:
    engine = tiny_engine()
    catalog = engine.catalog
    [sid] = free_sids(engine, 1)
    rows = [{"item_id": N_ITEMS, "semantic_id": sid}, {"item_id": N_ITEMS + 1, "text": "x"}]
    state, mine = next_generative("upsert", rows, catalog, ranker=True)
    assert mine == [N_ITEMS] and state is not None and state.num_items == N_ITEMS + 1
    assert engine.catalog is catalog  # planned, not installed
    assert [it["item_id"] for it in ranker_items("upsert", rows)] == [N_ITEMS + 1]
    assert ranker_items("retire", [3]) is None
    assert next_generative("upsert", rows[1:], catalog, ranker=True) == (None, [])


def test_a_retire_takes_the_known_rows_when_a_ranker_takes_every_one() -> None:
    catalog = tiny_engine().catalog
    state, mine = next_generative("retire", [3, N_ITEMS + 7], catalog, ranker=True)
    assert mine == [3] and state is not None
    with pytest.raises(ValueError):
        next_generative("retire", [3, N_ITEMS + 7], catalog, ranker=False)
    with pytest.raises(ValueError, match="item_ids: no catalog to retire items from"):
        next_generative("retire", [3], None, ranker=False)


def test_the_ranker_is_called_only_with_its_part() -> None:
    updater = Calls()
    assert run_ranker(updater, "upsert", [], [], IDS) is None
    assert run_ranker(updater, "upsert", [], [{"item_id": 1}], IDS) == 5
    assert run_ranker(updater, "retire", [1, 2], None, IDS) == 6
    assert run_ranker(None, "retire", [1], None, IDS) is None
    assert updater.calls == [("upsert", [{"item_id": 1}]), ("retire", [1, 2])]
