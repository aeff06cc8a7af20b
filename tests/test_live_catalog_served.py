"""The served base + delta catalog: background compaction (one at a time, updates made during
it carried over, dropped when the catalog was replaced, failures logged and not raised, in the
engine process with ``--engine-process``), and every endpoint over a catalog with a delta:
``/v1/completions`` resolves upserted and moved items and keeps accepting retired ones in
prompts, ``/v1/recommend`` with filters equals the offline engine, ``/metrics`` reports it.
Kept in a state directory (reopening it: test_live_catalog_state_dir.py), a failed write
installs nothing."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from logged_catalog_support import free_sids, reopened, stream
from serving_support import N_ITEMS, post, tiny_engine, wait_until

from genrec import BeamParams, Engine
from genrec.engine import RowRequest
from genrec.live_catalog.compaction import (
    COMPACT_MAX_ITEMS,
    COMPACT_MIN_ITEMS,
    compaction_threshold,
)
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.state import CatalogState
from genrec.live_catalog.stored import read_state

REQUESTS = [RowRequest([3, 17, 8]), RowRequest([5, 6], exclude=[0, 1, 2]),
            RowRequest([20], allow=[4, 9, 30, 31, N_ITEMS, N_ITEMS + 2])]


def answers(engine: Engine, catalog: CatalogState | None = None) -> list[tuple]:
    recs = engine.recommend_rows(REQUESTS, BeamParams(12, 12), catalog=catalog)
    return [(r.items, [round(s, 4) for s in r.scores]) for r in recs]


class Gate:
    """Holds :meth:`CatalogState.compacted` until opened (or makes it fail)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.entered, self.open, self.calls = threading.Event(), threading.Event(), 0
        compacted = CatalogState.compacted

        def held(state: CatalogState, device: str | None = None) -> CatalogState:
            self.calls += 1
            self.entered.set()
            self.open.wait(10)
            if fail:
                raise RuntimeError("compaction exploded")
            return compacted(state, device)

        monkeypatch.setattr(CatalogState, "compacted", held)


def test_device_work_beside_the_batches_waits_for_a_capture() -> None:
    # a capture holds the device's lock: an update built off the engine's thread, and the
    # install of a background compaction (built on the host), wait for it instead of issuing
    # device work during the capture (which would invalidate it)
    from concurrent.futures import ThreadPoolExecutor

    engine = tiny_engine()
    catalog = ServiceCatalog(engine, None, compact_threshold=1)
    sids = free_sids(engine, 2)
    lock = engine.device_work()
    with ThreadPoolExecutor(1) as pool:
        with lock:  # as a capture does
            update = pool.submit(catalog.prepare, "upsert",
                                 [{"item_id": N_ITEMS, "semantic_id": sids[0]}])
            wait_until(lambda: lock.waiting() == 1)
            assert not update.done()
        prepared = update.result(10)
    assert prepared.state is not None and prepared.state.delta_items.tolist() == [N_ITEMS]
    with lock:
        catalog.apply(prepared)  # delta 1: a compaction starts, built on the host
        wait_until(lambda: lock.waiting() == 1)  # its install waits for the device
        assert catalog.compactor.running and engine.catalog.delta_items.numel() == 1
    assert catalog.compactor.wait(10) and engine.catalog.delta_items.numel() == 0
    assert [e.outcome for e in catalog.stats().compactions] == ["installed"]


def test_threshold_rule() -> None:
    assert compaction_threshold(1000) == COMPACT_MIN_ITEMS
    assert compaction_threshold(1_000_000) == 10_000
    assert compaction_threshold(10**9) == COMPACT_MAX_ITEMS
    with pytest.raises(ValueError, match="compact_threshold"):
        ServiceCatalog(tiny_engine(), compact_threshold=-1)


def test_compaction_carries_later_updates_and_keeps_the_version(monkeypatch) -> None:
    engine = tiny_engine()
    catalog = ServiceCatalog(engine, None, version=3, compact_threshold=3)
    sids = free_sids(engine, 6)
    gate = Gate(monkeypatch)
    old_sid_of_4 = engine.catalog.codes_of([4])[0].tolist()
    catalog.upsert([{"item_id": N_ITEMS, "semantic_id": sids[0]},
                    {"item_id": 4, "semantic_id": sids[1]}])
    assert not catalog.compactor.running and catalog.stats().delta_items == 2
    catalog.upsert([{"item_id": 9, "semantic_id": sids[2]}])  # delta 3: compaction starts
    assert gate.entered.wait(5) and catalog.stats().compacting
    snapshot_base = engine.catalog.base_vocab
    # updates go on while it runs (and start no second compaction)
    catalog.upsert([{"item_id": N_ITEMS + 1, "semantic_id": sids[3]},
                    {"item_id": 9, "semantic_id": sids[4]}])
    catalog.retire([N_ITEMS, 31])
    catalog.upsert([{"item_id": N_ITEMS + 2, "semantic_id": sids[5]}])
    assert gate.calls == 1
    before, version = answers(engine), engine.catalog.version
    codes = engine.catalog.codes_of(torch.arange(N_ITEMS + 3))
    gate.open.set()
    assert catalog.compactor.wait(10)
    state = engine.catalog
    assert state.base_vocab is not snapshot_base and state.version == version == 8
    assert state.base_vocab.index.num_items == N_ITEMS + 1  # the snapshot's items
    assert sorted(state.delta_items.tolist()) == [9, N_ITEMS + 1, N_ITEMS + 2]
    assert torch.equal(state.codes_of(torch.arange(N_ITEMS + 3)), codes)
    assert state.retired() == [31, N_ITEMS] and answers(engine) == before
    assert [e.outcome for e in catalog.stats().compactions] == ["installed"]
    assert catalog.stats().compactions == ()  # drained
    # the next update past the threshold compacts again, from the new base
    monkeypatch.undo()
    catalog.upsert([{"item_id": 5, "semantic_id": old_sid_of_4}])  # free since 4 moved
    assert catalog.compactor.wait(10) and engine.catalog.delta_items.numel() == 0
    assert answers(engine) == answers(engine, state.updated([(5, old_sid_of_4)]))


def test_a_replaced_catalog_drops_the_compaction_and_failures_are_logged(
        monkeypatch, caplog) -> None:
    engine = tiny_engine()
    catalog = ServiceCatalog(engine, None, compact_threshold=1)
    sids = free_sids(engine, 3)
    gate = Gate(monkeypatch)
    catalog.upsert([{"item_id": N_ITEMS, "semantic_id": sids[0]}])
    assert gate.entered.wait(5)
    engine.set_vocab(engine.catalog.vocab)  # a new base installed meanwhile
    replaced = engine.catalog
    gate.open.set()
    assert catalog.compactor.wait(10) and engine.catalog is replaced
    assert [e.outcome for e in catalog.stats().compactions] == ["dropped"]
    monkeypatch.undo()
    gate = Gate(monkeypatch, fail=True)
    gate.open.set()
    change = catalog.upsert([{"item_id": N_ITEMS + 1, "semantic_id": sids[1]}])
    assert catalog.compactor.wait(10) and change.version == engine.catalog.version
    assert [e.outcome for e in catalog.stats().compactions] == ["failed"]
    assert "compaction failed" in caplog.text and engine.catalog.delta_items.numel() == 1
    catalog.retire([0])  # no new delta item, still past the threshold: tries again
    assert catalog.compactor.wait(10) and gate.calls == 2
    catalog.close()
    catalog.upsert([{"item_id": N_ITEMS + 2, "semantic_id": sids[2]}])
    assert gate.calls == 2  # closed: no more compactions


def test_prepared_updates_swap_in_or_are_rebuilt() -> None:
    engine = tiny_engine()
    catalog = ServiceCatalog(engine, None, compact_threshold=0)
    sids = free_sids(engine, 2)
    first = catalog.prepare("upsert", [{"item_id": N_ITEMS, "semantic_id": sids[0]}])
    second = catalog.prepare("upsert", [{"item_id": N_ITEMS, "semantic_id": sids[1]}])
    assert engine.catalog is first.base is second.base  # nothing installed
    catalog.apply(first)
    assert engine.catalog.delta_trie is first.state.delta_trie  # swapped in as built
    change = catalog.apply(second)  # built on an older state: rebuilt on the current one
    assert change.version == 2 and change.catalogs == {"generative": [str(N_ITEMS)]}
    assert engine.catalog.codes_of([N_ITEMS])[0].tolist() == sids[1]
    assert engine.catalog.num_items == N_ITEMS + 1
    with pytest.raises(ValueError, match=r"items\[0\]\.semantic_id\[1\]"):
        catalog.prepare("upsert", [{"item_id": 3, "semantic_id": [0, 9, 0]}])
    with pytest.raises(ValueError, match=r"item_ids: unknown item ids \['45'\]"):
        catalog.prepare("retire", [1, N_ITEMS + 5])
    assert catalog.catalog_version == 2


def test_endpoints_over_a_catalog_with_a_delta() -> None:
    import httpx

    from genrec.serving import BackgroundServer, ServeConfig, create_app

    engine = tiny_engine()
    sids = free_sids(engine, 3)
    app = create_app(engine, config=ServeConfig(max_wait_ms=1, compact_threshold=4))
    with BackgroundServer(app) as server:
        url = server.url
        old_sid_of_9 = engine.catalog.codes_of([9])[0].tolist()
        r = httpx.put(url + "/v1/catalog/items", json={"items": [
            {"item_id": N_ITEMS, "semantic_id": sids[0]}, {"item_id": 9, "semantic_id": sids[1]},
            {"item_id": N_ITEMS + 1, "semantic_id": sids[2]}]})
        assert r.status_code == 200, r.text
        r = httpx.request("DELETE", url + "/v1/catalog/items", json={"item_ids": [17]})
        assert r.status_code == 200 and engine.catalog.delta_items.numel() == 3
        text = lambda sid: " ".join(f"<{'abc'[k]}_{c}>" for k, c in enumerate(sid))  # noqa: E731
        for prompt, history in ((text(sids[0]) + " " + text(sids[1]), [N_ITEMS, 9]),
                                (engine.catalog.prompts([[N_ITEMS + 1, 17]], [False])[0],
                                 [N_ITEMS + 1, 17])):  # a retired item may stay in a history
            r = post(url, "/v1/completions", {"prompt": prompt, "use_beam_search": True, "n": 4,
                                              "best_of": 8})
            assert r.status_code == 200, r.text
            want = engine.recommend_rows([RowRequest(history)], BeamParams(8, 4))[0]
            choices = r.json()["choices"]
            assert [c["item_id"] for c in choices] == [str(i) for i in want.items]
            assert 17 not in want.items
            assert [c["text"] for c in choices] == [text(engine.catalog.codes_of([i])[0].tolist())
                                                    for i in want.items]
        for prompt in (text(old_sid_of_9), text([0, 0, 99999999999999999999999])):
            r = post(url, "/v1/completions", {"prompt": prompt, "use_beam_search": True})
            assert r.status_code == 422 and "not a catalog item" in r.text, r.text
            assert r.json()["error"]["param"] == "prompt"
        for body in ({"history": [3, N_ITEMS], "allow": [9, 17, N_ITEMS + 1, 30], "n": 3,
                      "beam_width": 6},
                     {"history": [9], "exclude": [N_ITEMS, 0, 1], "n": 5, "beam_width": 10}):
            r = post(url, "/v1/recommend", body).json()
            rec = engine.recommend_rows([RowRequest(body["history"], None, body.get("exclude"),
                                                     body.get("allow"))],
                                   BeamParams(body["beam_width"], body["n"]))[0]
            assert r["items"] == [str(i) for i in rec.items] and "17" not in r["items"]
        metrics = httpx.get(url + "/metrics").text
        assert "genrec_catalog_delta_items 3.0" in metrics
        assert "genrec_catalog_compacting 0.0" in metrics
        r = httpx.put(url + "/v1/catalog/items",  # delta 4: a compaction, version unchanged
                      json={"items": [{"item_id": 3, "semantic_id": old_sid_of_9}]})
        assert r.status_code == 200
        assert app.state.service.catalog.compactor.wait(10)
        assert engine.catalog.version == r.json()["catalog_version"]
        metrics = httpx.get(url + "/metrics").text
        assert "genrec_catalog_delta_items 0.0" in metrics
        assert 'genrec_catalog_compaction_seconds_count{outcome="installed"} 1.0' in metrics
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": 4, "semantic_id": [0, 9, 0]}]})
        assert r.status_code == 422 and r.json()["detail"].startswith("items[0].semantic_id[1]")


def test_the_engine_process_compacts_its_own_catalog(checkpoint: Path) -> None:
    import httpx

    from genrec.serving import BackgroundServer, ServeConfig
    from genrec.serving.ray_app import AppSpec, load_app

    spec = AppSpec.of(checkpoint, threads=1, config=ServeConfig(
        max_wait_ms=1, engine_process=True, compact_threshold=2))
    app = load_app(spec)
    reference = Engine.from_pretrained(checkpoint)
    sids = free_sids(reference, 2)
    upserts = [(N_ITEMS, sids[0]), (N_ITEMS + 1, sids[1])]
    with BackgroundServer(app) as server:
        url = server.url
        for item, sid in upserts:
            r = httpx.put(url + "/v1/catalog/items",
                          json={"items": [{"item_id": item, "semantic_id": sid}]})
            assert r.status_code == 200, r.text
        installed = 'genrec_catalog_compaction_seconds_count{outcome="installed"} 1.0'

        def compacted() -> bool:  # reported with the child's next answer
            post(url, "/v1/recommend", {"history": [3]})
            return installed in httpx.get(url + "/metrics").text

        wait_until(compacted, timeout=30)
        assert "genrec_catalog_delta_items 0.0" in httpx.get(url + "/metrics").text
        body = {"history": [3, N_ITEMS], "allow": [N_ITEMS + 1, 5, 6], "n": 3, "beam_width": 6}
        got = post(url, "/v1/recommend", body).json()
        state = reference.catalog.updated(upserts[:1]).updated(upserts[1:])
        want = reference.recommend_rows([RowRequest(body["history"], allow=body["allow"])],
                                   BeamParams(6, 3), catalog=state)[0]
        assert got["items"] == [str(i) for i in want.items] and got["catalog_version"] == 2
        assert httpx.get(url + "/ready").json()["catalog_version"] == 2


# -- durability: a catalog kept in a state directory ----------------------------------------

def test_a_failed_append_installs_nothing(tmp_path: Path, monkeypatch) -> None:
    catalog, _ = reopened(tmp_path / "state")
    stream(catalog, 4, seed=4)
    state, version = catalog.engine.catalog, catalog.catalog_version
    before = read_state(tmp_path / "state")

    def failing(fd: int) -> None:
        raise OSError("I/O error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="I/O error"):
        catalog.retire([5])
    monkeypatch.undo()
    assert catalog.engine.catalog is state and catalog.catalog_version == version
    assert read_state(tmp_path / "state").records == before.records  # cut off again
    with pytest.raises(RuntimeError, match="a write failed"):
        catalog.retire([5])
    catalog.close()
    assert reopened(tmp_path / "state")[0].catalog_version == version
