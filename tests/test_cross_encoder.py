"""The MiniLM cross-encoder teacher: prefix-once multi-item scoring, its ranker and loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_bert import tiny_bert

from genrec.duolm.cross_encoder import (
    CrossEncoder,
    CrossEncoderRanker,
    encoder_prompts,
    load_teacher,
)
from genrec.duolm.prompts import TeacherPrompts
from genrec.duolm.requests import RankRequest, RowRankRequest
from genrec.engine.inputs import InputError

ITEMS = {i: {"title": f"item {i} widget", "description": f"a {'blue ' * (i % 4)}thing number {i}"}
         for i in range(12)}


def encoder(tmp_path: Path) -> CrossEncoder:
    torch.manual_seed(0)
    return CrossEncoder.from_sentence_encoder(tiny_bert(tmp_path / "bert", vocab_size=30522)
                                              ).eval()


def prompts() -> TeacherPrompts:
    return TeacherPrompts.from_items(ITEMS, 12, max_title_tokens=4, max_text_tokens=9,
                                     max_history=5)


def by_hand(model: CrossEncoder, prefix: list[int], cand: list[int]) -> torch.Tensor:
    """One sequence: the prefix (segment 0) sees itself, the candidate (segment 1) both."""
    p, t = len(prefix), len(prefix) + len(cand)
    mask = torch.ones(1, t, t, dtype=torch.bool)
    mask[0, :p, p:] = False
    hidden, _ = model.bert(torch.tensor([prefix + cand]), torch.arange(t)[None],
                           torch.tensor([[0] * p + [1] * len(cand)]), mask)
    return model.score(hidden[0, p:].mean(0))[0]


def test_scores_are_one_sequence_each_whatever_the_packing(tmp_path: Path) -> None:
    model = encoder(tmp_path)
    assert model.bert.config.attention_probs_dropout_prob == 0.0
    prefixes = [[101, 2000, 2001, 102], [101, 3000, 102, 3001, 3002, 102]]
    cands = [[[4000, 4001, 102], [4002, 102], [4003, 4004, 4005, 102]], [[5000, 102]]]
    with torch.no_grad():
        packed = model(prefixes, cands)
        apart = model(prefixes, cands, row_tokens=1, rows_per_chunk=1)
        alone = model([prefixes[0]], [[cands[0][2]]])[0]
        for u, cs in enumerate(cands):
            for c, cand in enumerate(cs):
                want = by_hand(model, prefixes[u], cand)
                assert abs(float(packed[u][c] - want)) < 1e-5
                assert abs(float(apart[u][c] - want)) < 1e-5
    assert abs(float(alone[0] - packed[0][2])) < 1e-5  # the other candidates change nothing


def test_ranker_scores_rows_and_ids_and_names_bad_fields(tmp_path: Path) -> None:
    p = prompts()
    ranker = CrossEncoderRanker(encoder(tmp_path), p, [f"sku{i}" for i in range(12)])
    scores = ranker.rank_rows([RowRankRequest([1, 2], [3, 4, 5]), RowRankRequest([], [6])])
    assert [s.shape[0] for s in scores] == [3, 1]
    with torch.no_grad():
        want = by_hand(ranker.model, p.prefix([1, 2]), p.texts[4] + [p.sep_id])
    assert abs(float(scores[0][1] - want)) < 1e-5
    ranking = ranker.rank([RankRequest(["sku1", "sku2"], ["sku3", "sku4", "sku5"])])[0]
    order = torch.argsort(scores[0], descending=True, stable=True).tolist()
    assert ranking.items == [f"sku{3 + i}" for i in order]
    for reqs, field in [([], "requests"), ([RowRankRequest([1], [])], "candidates"),
                        ([RowRankRequest([99], [1])], "history"),
                        ([RowRankRequest([1], [12])], "candidates"),
                        ([RowRankRequest([1], [2], torch.zeros(4))], "user_vector")]:
        with pytest.raises(InputError, match=field):
            ranker.rank_rows(reqs)


def test_positions_past_the_encoder_are_refused(tmp_path: Path) -> None:
    model = encoder(tmp_path)  # 64 positions
    with pytest.raises(InputError, match="positions"):
        model([[101] * 60], [[[2000] * 8]])


def test_saved_teacher_loads_by_its_backend(tmp_path: Path) -> None:
    model, p = encoder(tmp_path), prompts()
    folder = tmp_path / "teacher"
    model.save_pretrained(folder)
    meta = {"kind": "teacher", "backend": "minilm", "max_history": 5, "max_title_tokens": 4,
            "max_text_tokens": 9}
    (folder / "duolm.json").write_text(json.dumps(meta))
    teacher = load_teacher(folder, ITEMS, 12)
    assert isinstance(teacher, CrossEncoderRanker)
    req = [RowRankRequest([0, 1], [2, 3])]
    assert torch.allclose(teacher.rank_rows(req)[0],
                          CrossEncoderRanker(model, p).rank_rows(req)[0], atol=1e-6)
    (folder / "duolm.json").write_text(json.dumps({**meta, "kind": "student"}))
    with pytest.raises(ValueError, match="not a DuoLM teacher"):
        load_teacher(folder, ITEMS, 12)
    prefixes, cands = encoder_prompts(p, req)
    assert prefixes == [p.prefix([0, 1])] and cands == [[p.texts[2] + [p.sep_id],
                                                          p.texts[3] + [p.sep_id]]]
