"""Live generative catalog updates: retired items are never returned, new items with a
Semantic ID can be, bad updates name the field and change nothing, and the service updates
the generative catalog and the ranker's all or nothing under one version."""

from __future__ import annotations

import pytest
import torch
from search_reference import exhaustive_top
from serving_support import N_ITEMS, SIZES, EngineRanker, tiny_engine

from genrec import BeamParams, Engine
from genrec.engine import RowRequest
from genrec.live_catalog.served import ServiceCatalog

REQUESTS = [RowRequest([3, 17, 8]), RowRequest([1], [0.5] * 5),
            RowRequest([5, 6, 7], exclude=[0, 1, 2]),
            RowRequest([20], allow=[4, 9, 30, 31, 40])]


def free_sids(engine: Engine, n: int) -> list[list[int]]:
    """Semantic IDs no item has."""
    used = {tuple(c) for c in engine.vocab.index.codes.tolist()}
    every = torch.cartesian_prod(*[torch.arange(k) for k in SIZES]).tolist()
    return [c for c in every if tuple(c) not in used][:n]


def top(engine: Engine, requests: list[RowRequest], **kw: object) -> list[list[int]]:
    return [r.items for r in engine.recommend_rows(requests, BeamParams(60, 60), **kw)]


def test_retired_items_are_never_returned_and_wide_beams_stay_exact() -> None:
    engine = tiny_engine()
    before = engine.catalog
    first = top(engine, REQUESTS[:3])
    retired = sorted({first[0][0], first[1][0], first[1][3], 7})
    engine.set_catalog(before.updated(retire=retired))
    assert engine.catalog.retired() == retired and engine.catalog.version == 1
    got = engine.recommend_rows(REQUESTS[:3], BeamParams(60, 60))
    for request, rec in zip(REQUESTS[:3], got, strict=True):
        assert not set(rec.items) & set(retired)
        want, scores = exhaustive_top(engine, request, 60)
        assert rec.items == want.tolist()
        assert torch.allclose(torch.tensor(rec.scores), scores, atol=1e-4)
    for request, items in zip(REQUESTS[:2], top(engine, REQUESTS[:2]), strict=True):
        assert items == exhaustive_top(engine, request, 60)[0].tolist()  # no filter at all
    # a retired item may still be in a history; the old state still answers as before
    assert top(engine, [RowRequest(retired)])[0]
    assert top(engine, REQUESTS[:3], catalog=before) == first
    # an item comes back when upserted again
    back = before.updated(retire=retired).updated([(7, engine.vocab.index.codes[7].tolist())])
    assert back.retired() == [i for i in retired if i != 7]


def test_new_items_join_the_trie_and_collisions_name_the_field() -> None:
    engine = tiny_engine()
    state = engine.catalog
    sid_a, sid_b = free_sids(engine, 2)
    new = state.updated([(N_ITEMS, sid_a), (5, None), (N_ITEMS + 1, sid_b)])
    engine.set_catalog(new)
    assert new.num_items == N_ITEMS + 2 and new.vocab.index.codes[N_ITEMS].tolist() == sid_a
    got = engine.recommend_rows([REQUESTS[3]], BeamParams(60, 60))[0]
    assert N_ITEMS in got.items and got.items == exhaustive_top(engine, REQUESTS[3], 60)[0].tolist()
    assert engine.vocab.prompt([N_ITEMS])[1:] == engine.vocab.item_tokens([N_ITEMS])[0].tolist()
    taken = new.vocab.index.codes[3].tolist()
    bad = [
        ([(N_ITEMS + 2, taken)], r"items\[0\]\.semantic_id: .* already the Semantic ID of item 3"),
        ([(9, sid_a)], rf"items\[0\]\.semantic_id: .* item {N_ITEMS}"),
        ([(N_ITEMS + 2, free_sids(engine, 1)[0]), (N_ITEMS + 3, free_sids(engine, 1)[0])],
         r"items\[0\]\.semantic_id: .* also given to items\[1\]"),
        ([(N_ITEMS + 3, free_sids(engine, 1)[0])], rf"items\[0\]\.item_id: .*{N_ITEMS + 2} comes"),
        ([(1, [0, 0])], r"items\[0\]\.semantic_id: expected 3 codes"),
        ([(1, [0, 9, 0])], r"items\[0\]\.semantic_id\[1\]: code 9 is outside 0\.\.3"),
        ([(1, [0, 0, 0]), (1, [0, 1, 0])], r"items\[1\]\.item_id: item 1 is given twice"),
    ]
    for upsert, message in bad:
        with pytest.raises(ValueError, match=message):
            new.updated(upsert)
    with pytest.raises(ValueError, match=r"item_ids\[1\]: unknown item id 99"):
        new.updated(retire=[1, 99])
    assert engine.catalog is new and new.retired() == []  # nothing changed
    # a retired item keeps its Semantic ID: it cannot be reused
    with pytest.raises(ValueError, match=r"of item 3 \(retired\)"):
        new.updated(retire=[3]).updated([(N_ITEMS + 2, taken)])


class FailingUpdater:
    def __init__(self) -> None:
        self.calls: list[object] = []

    def upsert(self, items: list[dict], ids: object = None) -> int:
        self.calls.append(items)
        raise ValueError("items[0]: the ranker refuses")

    def retire(self, item_ids: list[int], ids: object = None) -> int:
        self.calls.append(item_ids)
        raise ValueError("item_ids[0]: the ranker refuses")


def test_service_catalog_is_all_or_nothing() -> None:
    engine = tiny_engine()
    state = engine.catalog
    updater = FailingUpdater()
    catalog = ServiceCatalog(engine, updater, version=3)
    sid = free_sids(engine, 1)[0]
    with pytest.raises(ValueError, match="ranker refuses"):  # ranker fails: engine unchanged
        catalog.upsert([{"item_id": N_ITEMS, "semantic_id": sid, "text": "lamp"}])
    with pytest.raises(ValueError, match="ranker refuses"):
        catalog.retire([1, 2])
    assert engine.catalog is state and catalog.catalog_version == 3
    calls = len(updater.calls)
    with pytest.raises(ValueError, match=r"items\[1\]\.semantic_id"):  # engine fails first
        catalog.upsert([{"item_id": 1, "text": "x"}, {"item_id": 2, "semantic_id": [0]}])
    assert len(updater.calls) == calls and engine.catalog is state
    # generative only: no ranker call; the one version grows
    alone = ServiceCatalog(engine, None, version=3)
    change = alone.upsert([{"item_id": N_ITEMS, "semantic_id": sid}])
    assert change.version == 4 and change.catalogs == {"generative": [str(N_ITEMS)]}
    assert engine.catalog.version == 4 and engine.catalog.num_items == N_ITEMS + 1
    change = alone.retire([N_ITEMS, 0])
    assert change.catalogs == {"generative": [str(N_ITEMS), "0"]} and alone.catalog_version == 5
    with pytest.raises(LookupError, match=r"items\[0\]: no ranker catalog"):
        alone.check([{"item_id": 1, "text": "lamp"}])


def test_http_catalog_updates_change_recommend() -> None:
    import httpx
    from serving_support import Updater, post

    from genrec.serving import BackgroundServer, ServeConfig, create_app

    engine = tiny_engine()
    sid = free_sids(engine, 1)[0]
    app = create_app(engine, ranker=EngineRanker(engine), catalog_updater=Updater(),
                     config=ServeConfig(max_wait_ms=1))
    body = {"history": [20], "allow": [4, 9, 30, 31], "n": 4, "beam_width": 8}
    with BackgroundServer(app) as server:
        url = server.url
        first = post(url, "/v1/recommend", body).json()
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": N_ITEMS, "semantic_id": sid}]})
        assert r.status_code == 200, r.text
        assert r.json() == {"catalog_version": 4, "count": 1,
                            "catalogs": {"generative": [str(N_ITEMS)]}}
        got = post(url, "/v1/recommend", {**body, "allow": [N_ITEMS]}).json()
        assert got["items"] == [str(N_ITEMS)] and got["catalog_version"] == 4
        r = httpx.request("DELETE", url + "/v1/catalog/items",
                          json={"item_ids": [first["items"][0]]})
        assert r.status_code == 200 and r.json()["catalogs"]["generative"] == [first["items"][0]]
        after = post(url, "/v1/recommend", body).json()
        assert after["items"] == first["items"][1:] and after["catalog_version"] == 11
        assert "genrec_catalog_version 11.0" in httpx.get(url + "/metrics").text
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": 7, "semantic_id": sid}]})
        assert r.status_code == 422 and r.json()["detail"].startswith("items[0].semantic_id")
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": 7, "semantic_id": [1, "a", 0]}]})
        assert r.status_code == 422 and r.json()["detail"].startswith("items[0].semantic_id")
        assert httpx.get(url + "/ready").json()["catalog_version"] == 11
