"""The rankers' public ``rank`` in the catalog's own ids: the same scores as the row-level
``rank_rows``, best first, unknown history ids skipped and reported, bad ids named."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from genrec.catalog.item_table import ItemTable
from genrec.duolm.prompts import SOFT_ID, STUDENT_VOCAB_SIZE, TeacherPrompts
from genrec.duolm.ranker import DuoRanker, TeacherRanker
from genrec.duolm.requests import Ranking, RankRequest, RowRankRequest
from genrec.engine import Engine
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import InputError
from genrec.model.registry import build_model
from genrec.training.duolm_task import ranker_config
from genrec.training.initialization import init_weights

N_ITEMS, K, HIDDEN = 30, 2, 32
IDS = [f"song-{i:03d}" for i in range(N_ITEMS)]


def make_ranker(item_ids: list[str] | None = IDS, user_dim: int = 0) -> DuoRanker:
    torch.manual_seed(0)
    config = ranker_config(STUDENT_VOCAB_SIZE, HIDDEN, 2, 4, 2, 128)
    model = build_model(dataclasses.replace(config, user_dim=user_dim))
    init_weights(model, std=0.2)
    engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID))
    return DuoRanker(engine, ItemTable(torch.randn(N_ITEMS, K, HIDDEN)), item_ids=item_ids)


def by_row(ranker: DuoRanker, history: list[int], candidates: list[int],
           feedback: list[str | None] | None = None) -> dict[str, float]:
    """The row-level scores, keyed by the candidates' ids."""
    scores = ranker.rank_rows([RowRankRequest(history, candidates, feedback=feedback)])[0]
    return {IDS[c]: float(s) for c, s in zip(candidates, scores, strict=True)}


def test_rank_pairs_each_candidate_id_with_its_row_score_best_first() -> None:
    ranker = make_ranker()
    cands = [0, 5, 29, 12, 7]
    got = ranker.rank([RankRequest([IDS[3], IDS[11]], [IDS[c] for c in cands])])
    assert len(got) == 1 and isinstance(got[0], Ranking)
    want = by_row(ranker, [3, 11], cands)
    assert sorted(got[0].items) == sorted(want)
    assert got[0].scores == sorted(got[0].scores, reverse=True)
    assert got[0].scores == pytest.approx([want[i] for i in got[0].items], abs=1e-6)
    assert got[0].ignored == []


def test_integers_name_their_decimal_strings() -> None:
    ranker = make_ranker(item_ids=None)  # rows named "0" .. "29"
    as_ints = ranker.rank([RankRequest([1, 2], [4, 5, 6])])[0]
    as_strings = ranker.rank([RankRequest(["1", "2"], ["4", "5", "6"])])[0]
    assert as_ints == as_strings
    assert sorted(as_ints.items) == ["4", "5", "6"]


def test_unknown_history_ids_are_skipped_with_their_feedback_and_reported() -> None:
    ranker = make_ranker()
    req = RankRequest(["nope", IDS[1], 42, IDS[2]], [IDS[4], IDS[9]],
                      feedback=["like", "rating_5", "skip", None])
    got = ranker.rank([req])[0]
    assert got.ignored == ["nope", "42"]
    want = by_row(ranker, [1, 2], [4, 9], feedback=["rating_5", None])
    assert got.scores == pytest.approx([want[i] for i in got.items], abs=1e-6)


def test_requests_in_one_call_are_answered_in_order() -> None:
    ranker = make_ranker()
    got = ranker.rank([RankRequest([IDS[9]], [IDS[3], IDS[4]]),
                       RankRequest([IDS[1], IDS[2]], [IDS[4], IDS[4]])])
    assert sorted(got[0].items) == [IDS[3], IDS[4]]
    assert got[1].items == [IDS[4], IDS[4]]  # a candidate given twice is scored twice
    assert got[1].scores[0] == pytest.approx(by_row(ranker, [1, 2], [4])[IDS[4]], abs=1e-5)


@pytest.mark.parametrize("reqs, field", [
    ([RankRequest([IDS[1]], [IDS[2]]), RankRequest([IDS[1]], [IDS[2], "gone", 7])],
     r"requests\[1\]\.candidates: unknown item ids \['gone', '7'\]"),
    ([RankRequest([IDS[1]], [])], r"requests\[0\]\.candidates: empty"),
    ([RankRequest([IDS[1]], [True])], r"requests\[0\]\.candidates\[0\]: an item id"),
    ([RankRequest(IDS[1], [IDS[2]])], r"requests\[0\]\.history: expected a list"),
    ([RankRequest([IDS[1]], IDS[2])], r"requests\[0\]\.candidates: expected a list"),
    ([RankRequest(["x", "y"], [IDS[2]])], r"requests\[0\]\.history: none of its 2 items"),
    ([RankRequest([IDS[1]], [IDS[2]], feedback=["like", None])],
     r"requests\[0\]\.feedback: 2 values for a history of 1"),
    ([RankRequest([IDS[1]], [IDS[2]], feedback=["meh"])], r"requests\[0\]\.feedback"),
    ([], r"requests: empty"),
])
def test_bad_requests_name_the_field(reqs: list[RankRequest], field: str) -> None:
    ranker = make_ranker()
    with pytest.raises(InputError, match=field):
        ranker.rank(reqs)


def test_unknown_history_with_a_user_vector_still_ranks() -> None:
    ranker = make_ranker(user_dim=3)
    vector = [0.5, -1.0, 2.0]
    got = ranker.rank([RankRequest(["x"], [IDS[2]], user_vector=vector)])[0]
    assert got.items == [IDS[2]] and got.ignored == ["x"]
    want = ranker.rank_rows([RowRankRequest([], [2], user_vector=vector)])[0]
    assert got.scores == pytest.approx(want.tolist(), abs=1e-6)


def test_updates_are_seen_by_id_retired_rejected_new_ids_ranked() -> None:
    ranker = make_ranker()
    ranker.update({"song-new": torch.randn(K, HIDDEN)}, retire=[IDS[5]])
    assert ranker.item_ids[N_ITEMS] == "song-new"
    with pytest.raises(InputError, match="retire: unknown item ids.*nope"):
        ranker.update(retire=["nope"])
    with pytest.raises(InputError, match="twice"):  # 7 and "7" are one id
        ranker.update({"7": torch.randn(K, HIDDEN), 7: torch.randn(K, HIDDEN)})
    assert ranker.catalog_version == 1
    with pytest.raises(InputError, match="retired"):
        ranker.rank([RankRequest([IDS[1]], [IDS[5]])])
    got = ranker.rank([RankRequest([IDS[1]], ["song-new", IDS[4]])])[0]
    scores = ranker.rank_rows([RowRankRequest([1], [N_ITEMS, 4])])[0].tolist()
    assert dict(zip(got.items, got.scores, strict=True)) == pytest.approx(
        {"song-new": scores[0], IDS[4]: scores[1]}, abs=1e-6)


def test_ids_must_match_the_table() -> None:
    with pytest.raises(ValueError, match="item_ids: 3 ids for a table of 30"):
        make_ranker(item_ids=["a", "b", "c"])


def test_the_teacher_ranks_by_id_too() -> None:
    torch.manual_seed(0)
    n, vocab = 6, 64
    prompts = TeacherPrompts(titles=[[10 + i] for i in range(n)],
                             texts=[[10 + i, 30 + i] for i in range(n)], bos_id=1, sep_id=2,
                             soft_id=3, score_id=4, yes_id=5, vocab_size=vocab)
    model = build_model(ranker_config(vocab, HIDDEN, 2, 4, 2, 128))
    init_weights(model, std=0.2)
    teacher = TeacherRanker(Engine(model, config=EngineConfig(soft_token_id=3)), prompts,
                            item_ids=[f"b{i}" for i in range(n)])
    got = teacher.rank([RankRequest(["b1", "zz"], ["b2", "b4"])])[0]
    want = teacher.rank_rows([RowRankRequest([1], [2, 4])])[0].tolist()
    assert got.ignored == ["zz"]
    assert dict(zip(got.items, got.scores, strict=True)) == pytest.approx(
        {"b2": want[0], "b4": want[1]}, abs=1e-6)
