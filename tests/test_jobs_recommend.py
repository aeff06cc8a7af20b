"""The batch job's library (genrec.jobs.recommend): users in batches through the engine, the
same answers as one engine call per user, reranking as ``/v1/recommend`` does, and the atomic
JSON-lines writer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from serving_support import EngineRanker, tiny_engine

from genrec import BeamParams, Engine
from genrec.duolm.requests import RowRankRequest
from genrec.engine import RowRecommendation, RowRequest
from genrec.jobs import BatchParams, recommend_users, write_recommendations

HISTORIES = [[3, 17, 8], [1], [5, 6, 7, 8, 9, 10, 11, 12], [20, 20, 21], [0, 39]]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine(user_dim=0)


def one_by_one(engine: Engine, history: list[int], params: BeamParams,
               exclude: bool) -> RowRecommendation:
    request = RowRequest(history, exclude=sorted(set(history)) if exclude else None)
    return engine.recommend_rows([request], params)[0]


@pytest.mark.parametrize("include_history", [False, True])
def test_batches_give_each_user_its_own_answer(engine: Engine, include_history: bool) -> None:
    params = BatchParams(n=6, beam_width=8, batch_size=2, include_history=include_history)
    found = list(recommend_users(engine, HISTORIES, params))
    assert len(found) == len(HISTORIES)
    for history, rec in zip(HISTORIES, found, strict=True):
        want = one_by_one(engine, history, BeamParams(8, 6), not include_history)
        assert rec.items == want.items
        assert rec.scores == pytest.approx(want.scores, abs=1e-4)
        assert len(rec.items) == 6
        if not include_history:
            assert not set(rec.items) & set(history)


def test_history_is_excluded_only_when_asked(engine: Engine) -> None:
    """Without exclusion a history item can come back (the tiny model favours some); with
    it, never."""
    kept = list(recommend_users(engine, HISTORIES, BatchParams(n=20, include_history=True)))
    assert any(set(r.items) & set(h) for h, r in zip(HISTORIES, kept, strict=True))


def test_rerank_orders_the_beam_by_the_ranker(engine: Engine) -> None:
    ranker = EngineRanker(engine)
    params = BatchParams(n=3, beam_width=8, batch_size=4)
    found = list(recommend_users(engine, HISTORIES, params, rerank=ranker.rank_rows))
    for history, rec in zip(HISTORIES, found, strict=True):
        beam = one_by_one(engine, history, BeamParams(8, 8), True)
        scores = ranker.rank_rows([RowRankRequest(history, beam.items)])[0]
        top = torch.argsort(scores, descending=True, stable=True)[:3].tolist()
        assert rec.items == [beam.items[i] for i in top]
        assert rec.scores == pytest.approx([float(scores[i]) for i in top], abs=1e-5)


def test_bad_parameters_are_named(engine: Engine) -> None:
    with pytest.raises(ValueError, match="n .* must not exceed beam_width"):
        list(recommend_users(engine, HISTORIES, BatchParams(n=10, beam_width=5)))
    with pytest.raises(ValueError, match="batch_size"):
        list(recommend_users(engine, HISTORIES, BatchParams(batch_size=0)))
    with pytest.raises(ValueError, match="user_vectors: 1 rows for 5 users"):
        list(recommend_users(engine, HISTORIES, BatchParams(n=2), torch.zeros(1, 5)))


def test_written_in_the_tables_ids_atomically(engine: Engine, tmp_path: Path) -> None:
    out = tmp_path / "recs.jsonl"
    ids = [f"song-{i:03d}" for i in range(40)]
    users = [f"u{k}" for k in range(len(HISTORIES))]
    found = list(recommend_users(engine, HISTORIES, BatchParams(n=4)))
    assert write_recommendations(out, users, ids, found) == len(HISTORIES)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["user_id"] for line in lines] == users
    assert lines[0]["items"] == [ids[i] for i in found[0].items]
    assert lines[0]["scores"] == found[0].scores

    def failing() -> Iterator[RowRecommendation]:
        yield found[0]
        raise RuntimeError("engine failed")

    before = out.read_bytes()
    with pytest.raises(RuntimeError, match="engine failed"):
        write_recommendations(out, users, ids, failing())
    assert out.read_bytes() == before and sorted(tmp_path.iterdir()) == [out]
