"""The typed boundary (messages) and the worker: each message runs its own method, results carry
the catalog version they were computed against, an unknown message is refused, and messages
are hashable (scheduler groups) and picklable (the engine process's pipe)."""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace

import pytest
import torch
from serving_support import N_ITEMS, EngineRanker, Updater, tiny_engine

from genrec import BeamParams, Engine, ScoreParams, ScoreRequest
from genrec.engine import RowRequest
from genrec.live_catalog.compaction import CatalogStats
from genrec.live_catalog.update_plan import CatalogChange
from genrec.serving import RowRankRequest, Worker
from genrec.serving.messages import (
    Batch,
    CatalogOp,
    CatalogUpdate,
    RankBatch,
    RecommendBatch,
    Reply,
    ScoreBatch,
    Versioned,
)
from genrec.serving.worker import initial_version

MESSAGES = [RecommendBatch(8, 4), ScoreBatch((3, 4), True), RankBatch(), CatalogUpdate(7)]


def _recording(name: str, calls: list[str]):  # noqa: ANN202
    method = getattr(Worker, name)

    def recorded(self, message, payloads):  # noqa: ANN001, ANN202
        calls.append(name)
        return method(self, message, payloads)

    return recorded


@pytest.fixture()
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the Worker methods run, in order (of workers built from now on)."""
    calls: list[str] = []
    for name in ("recommend", "score", "rank", "update_catalog"):
        monkeypatch.setattr(Worker, name, _recording(name, calls))
    return calls


@pytest.fixture()
def engine() -> Engine:
    return tiny_engine()


def test_each_message_runs_its_method_and_results_carry_the_version(engine: Engine,
                                                                     ran: list[str]) -> None:
    worker = Worker(engine, EngineRanker(engine), Updater())
    assert worker.catalog_version == 3  # the ranker's
    recs = [RowRequest([3, 17, 8]), RowRequest([1], user_vector=[0.5] * 5)]
    got = worker.run(RecommendBatch(8, 4), recs)
    want = engine.recommend_rows(recs, BeamParams(8, 4))
    assert [r.value.items for r in got] == [w.items for w in want]
    assert all(isinstance(r, Versioned) and r.catalog_version == 3 for r in got)

    groups = [[ScoreRequest([0, 3, 4], [[5, 6], [7]])],
              [ScoreRequest([0, 9], [[10]]), ScoreRequest([0, 5], [[6]])]]
    scored = worker.run(ScoreBatch((3, 4), False), groups)
    assert [len(s.value) for s in scored] == [1, 2]  # split back per HTTP request
    params = ScoreParams(mode="labels", label_token_ids=[3, 4])
    for group, result in zip(groups, scored, strict=True):
        want = engine.score_requests(group, params)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(result.value, want,
                                                                   strict=True))

    ranked = worker.run(RankBatch(), [RowRankRequest([1, 2], [4, 5, 6])])
    assert ranked[0].value.shape == (3,) and ranked[0].catalog_version == 3

    change = worker.run(CatalogUpdate(0), [CatalogOp("retire", [4])])[0]
    assert isinstance(change, CatalogChange) and change.version == 11  # the updater's
    assert worker.catalog_version == 11
    assert worker.run(RecommendBatch(8, 4), recs[:1])[0].catalog_version == 11
    assert ran == ["recommend", "score", "rank", "update_catalog", "recommend"]


def test_prepared_and_plain_catalog_updates(engine: Engine) -> None:
    worker = Worker(engine, compact_threshold=0)
    assert worker.catalog_version == 3  # the item table's: no ranker
    prepared = worker.catalog.prepare("retire", [5])
    changes = worker.run(CatalogUpdate(1), [prepared])
    assert changes[0].version == 4 and changes[0].catalogs == {"generative": ["5"]}
    worker.run(CatalogUpdate(2), [CatalogOp("retire", [6])])
    assert engine.catalog.retired() == [5, 6] and worker.catalog_version == 5
    stats = worker.catalog_stats()
    assert isinstance(stats, CatalogStats) and stats.delta_items == 0
    worker.close()
    assert not worker.catalog.compactor.maybe_start()  # closed: no more compactions


def test_unknown_messages_and_missing_parts_are_refused(engine: Engine) -> None:
    worker = Worker(engine)
    with pytest.raises(TypeError, match="unknown message"):
        worker.run(("recommend", 8, 4), [RowRequest([1])])
    with pytest.raises(RuntimeError, match="no ranker"):
        worker.run(RankBatch(), [RowRankRequest([1], [2])])
    with pytest.raises(ValueError, match="unknown item id"):
        worker.run(RecommendBatch(4, 2), [RowRequest([N_ITEMS + 1])])
    bare = Worker(SimpleNamespace(catalog=None, item_table=None))
    assert bare.catalog is None and bare.catalog_version == 0 and bare.catalog_stats() is None
    with pytest.raises(RuntimeError, match="no service catalog"):
        bare.run(CatalogUpdate(0), [CatalogOp("retire", [1])])
    bare.close()


def test_initial_version_rule() -> None:
    table, catalog = SimpleNamespace(version=3), SimpleNamespace(version=5)
    ranker = SimpleNamespace(catalog_version=9)
    assert initial_version(SimpleNamespace(item_table=table, catalog=catalog), ranker) == 9
    assert initial_version(SimpleNamespace(item_table=table, catalog=catalog), None) == 3
    assert initial_version(SimpleNamespace(item_table=None, catalog=catalog), None) == 5
    assert initial_version(SimpleNamespace(item_table=None, catalog=None), None) == 0


def test_messages_are_hashable_frozen_and_picklable() -> None:
    assert RecommendBatch(8, 4) == RecommendBatch(8, 4)
    assert hash(ScoreBatch((3, 4), True)) == hash(ScoreBatch((3, 4), True))
    assert RankBatch() == RankBatch() and CatalogUpdate(1) != CatalogUpdate(2)
    assert len(set(MESSAGES + MESSAGES)) == len(MESSAGES)
    assert [m.kind for m in MESSAGES] == ["recommend", "score", "rank", "catalog"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        MESSAGES[0].n = 3  # type: ignore[misc]
    envelope = Batch(RecommendBatch(8, 4), [RowRequest([1, 2])])
    reply = Reply(True, [Versioned(torch.ones(2), 4)], CatalogStats(3))
    for value in (*MESSAGES, CatalogOp("upsert", [{"item_id": 1}]), envelope):
        assert pickle.loads(pickle.dumps(value)) == value
    back = pickle.loads(pickle.dumps(reply))
    assert back.catalog == CatalogStats(3) and back.value[0].catalog_version == 4
    assert torch.equal(back.value[0].value, torch.ones(2))
