"""DuoLM rankers on the engine: scores, bad input, live item-table updates."""

from __future__ import annotations

import threading

import pytest
import torch

from genrec.catalog.id_map import IdMap
from genrec.catalog.item_table import ItemTable
from genrec.duolm.prompts import SOFT_ID, STUDENT_VOCAB_SIZE, YES_ID, StudentPrompts
from genrec.duolm.ranker import DuoRanker
from genrec.duolm.requests import RankRequest, RowRankRequest
from genrec.duolm.store import write_store
from genrec.engine import Engine
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import InputError
from genrec.engine.params import ScoreParams
from genrec.model.registry import build_model
from genrec.training.duolm_task import ranker_config
from genrec.training.initialization import init_weights

N_ITEMS, K, HIDDEN = 30, 2, 32


def make_ranker(seed: int = 0) -> DuoRanker:
    torch.manual_seed(seed)
    model = build_model(ranker_config(STUDENT_VOCAB_SIZE, HIDDEN, 2, 4, 2, 128))
    init_weights(model, std=0.2)
    engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID))
    return DuoRanker(engine, ItemTable(torch.randn(N_ITEMS, K, HIDDEN)))


def alone_score(ranker: DuoRanker, history: list[int], item: int) -> float:
    """prefix + candidate as one plain sequence (no branches), last position's log p(yes)."""
    p = StudentPrompts(K, STUDENT_VOCAB_SIZE)
    seq = p.prefix(history) + p.candidate(item)
    engine = ranker.engine
    out = engine.score(seq[:-1], [seq[-1:]], ScoreParams("labels", [YES_ID]))
    return float(out[0, 0])


def test_scores_match_each_candidate_alone() -> None:
    ranker = make_ranker()
    history, cands = [3, 7, 11], [0, 5, 29, 12]
    scores = ranker.rank_rows([RowRankRequest(history, cands)])[0]
    expected = torch.tensor([alone_score(ranker, history, c) for c in cands])
    torch.testing.assert_close(scores, expected, atol=1e-4, rtol=0)


def test_score_does_not_depend_on_other_candidates() -> None:
    ranker = make_ranker()
    alone = ranker.rank_rows([RowRankRequest([1, 2], [4])])[0]
    crowd = ranker.rank_rows([RowRankRequest([1, 2], list(range(N_ITEMS)) * 4)])[0]
    assert torch.allclose(crowd[4], alone[0], atol=1e-5)
    batched = ranker.rank_rows([RowRankRequest([9], [3, 4]), RankRequest([1, 2], [4])])[1]
    assert torch.allclose(batched[0], alone[0], atol=1e-5)


def test_feedback_tokens_change_the_prefix() -> None:
    ranker = make_ranker()
    plain = ranker.rank_rows([RowRankRequest([1, 2], [4])])[0]
    liked = ranker.rank_rows([RowRankRequest([1, 2], [4], feedback=["like", "rating_5"])])[0]
    assert not torch.allclose(plain, liked)
    with pytest.raises(InputError, match=r"requests\[0\]\.feedback"):
        ranker.rank_rows([RowRankRequest([1, 2], [4], feedback=["meh", None])])


@pytest.mark.parametrize("req, field", [
    (RowRankRequest([1], [N_ITEMS]), r"requests\[0\]\.candidates: unknown item id 30"),
    (RowRankRequest([-1], [2]), r"requests\[0\]\.history: unknown item id -1"),
    (RowRankRequest([1], []), r"requests\[0\]\.candidates: empty"),
    (RowRankRequest([1], ["a"]), r"requests\[0\]\.candidates: item ids must be integers"),
])
def test_bad_requests_name_the_field(req: RowRankRequest, field: str) -> None:
    ranker = make_ranker()
    with pytest.raises(InputError, match=field):
        ranker.rank_rows([req])
    assert ranker.rank_rows([RowRankRequest([1], [2])])[0].shape == (1,)  # still usable


def test_update_replaces_adds_and_retires_all_or_nothing() -> None:
    ranker = make_ranker()
    before = ranker.rank_rows([RowRankRequest([1, 2], [3, 4, 5])])[0]
    version = ranker.update({4: torch.randn(K, HIDDEN), N_ITEMS: torch.randn(K, HIDDEN)},
                            retire=[5])
    assert version == 1 and ranker.catalog_version == 1 and ranker.table.num_items == N_ITEMS + 1
    after = ranker.rank_rows([RowRankRequest([1, 2], [3, 4, N_ITEMS])])[0]
    assert torch.allclose(after[0], before[0], atol=1e-6)  # untouched item: same score
    assert not torch.allclose(after[1], before[1])  # replaced item: new score
    with pytest.raises(InputError, match="retired"):
        ranker.rank_rows([RowRankRequest([1, 2], [5])])
    with pytest.raises(InputError, match="retired"):  # also through raw virtual tokens
        ranker.engine.score([0], [ranker.prompts.candidate(5)], ScoreParams("labels", [YES_ID]))
    # a bad update changes nothing
    with pytest.raises(InputError, match=r"items\[3\]"):
        ranker.update({2: torch.randn(K, HIDDEN), 3: torch.full((K, HIDDEN), float("nan"))})
    with pytest.raises(InputError, match="items"):  # rows the id map does not name
        ranker.update_rows({N_ITEMS + 5: torch.randn(K, HIDDEN)})
    assert ranker.catalog_version == 1
    again = ranker.rank_rows([RowRankRequest([1, 2], [3, 4, N_ITEMS])])[0]
    torch.testing.assert_close(again, after)
    # an item can come back
    ranker.update({5: torch.randn(K, HIDDEN)})
    assert ranker.rank_rows([RowRankRequest([1], [5])])[0].shape == (1,)


def test_served_catalog_rows_the_ranker_lacks_are_added_retired() -> None:
    # the served id map names two more rows (items of the generative catalog only) than the
    # table has; the ranker takes a new item past them and can retire one of them
    ranker = make_ranker()
    ids = IdMap.rows_named(N_ITEMS).extended(["gen-a", "gen-b", "both"])
    ranker.update_rows({N_ITEMS + 2: torch.randn(K, HIDDEN)}, ids=ids)
    assert ranker.table.num_items == N_ITEMS + 3
    assert ranker.item_ids[N_ITEMS:] == ["gen-a", "gen-b", "both"]
    assert ranker.rank_rows([RowRankRequest([1], [N_ITEMS + 2])])[0].shape == (1,)
    with pytest.raises(InputError, match="retired"):
        ranker.rank_rows([RowRankRequest([1], [N_ITEMS])])
    ranker.update_rows(retire=[N_ITEMS + 1], ids=ids)
    ranker.update_rows({N_ITEMS: torch.randn(K, HIDDEN)}, ids=ids)  # later given: ranked
    assert ranker.rank_rows([RowRankRequest([1], [N_ITEMS])])[0].shape == (1,)
    assert sorted(ranker.rank([RankRequest(["1"], ["both", "gen-a"])])[0].items) == [
        "both", "gen-a"]
    with pytest.raises(InputError, match="retired"):
        ranker.rank([RankRequest(["1"], ["gen-b"])])


def test_requests_during_updates_see_one_table_version() -> None:
    ranker = make_ranker()
    req = RowRankRequest([1, 2, 3], list(range(N_ITEMS)))
    tables = [torch.randn(N_ITEMS, K, HIDDEN) for _ in range(2)]
    expected = []
    for t in tables:
        ranker.update(dict(enumerate(t)))
        expected.append(ranker.rank_rows([req])[0])
    stop = threading.Event()

    def flip() -> None:
        i = 0
        while not stop.is_set():
            ranker.update(dict(enumerate(tables[i % 2])))
            i += 1

    thread = threading.Thread(target=flip)
    thread.start()
    try:
        for _ in range(30):
            got = ranker.rank_rows([req])[0]
            assert any(torch.allclose(got, e, atol=1e-6) for e in expected)
    finally:
        stop.set()
        thread.join()


def test_from_pretrained_checks_the_store(tmp_path) -> None:  # noqa: ANN001
    from genrec.model.checkpoint import save_model
    from genrec.utils.atomic import atomic_write_json

    ranker = make_ranker()
    save_model(ranker.engine.model, tmp_path / "m")
    atomic_write_json(tmp_path / "m" / "duolm.json", {"kind": "student", "max_history": 20})
    ids = [f"item{i}" for i in range(N_ITEMS)]
    write_store(tmp_path / "store", ranker.table.vectors, ids)
    loaded = DuoRanker.from_pretrained(tmp_path / "m", tmp_path / "store")
    got = loaded.rank([RankRequest(["item1", "item2"], ["item3", "item4"])])[0]
    want = ranker.rank_rows([RowRankRequest([1, 2], [3, 4])])[0]
    torch.testing.assert_close(torch.tensor([got.scores[got.items.index(f"item{c}")]
                                             for c in (3, 4)]), want)
    assert loaded.item_ids == ids and loaded.catalog_version == 1
    write_store(tmp_path / "bad", torch.randn(N_ITEMS, K, HIDDEN + 1), ids)
    with pytest.raises(ValueError, match="hidden size"):
        DuoRanker.from_pretrained(tmp_path / "m", tmp_path / "bad")
