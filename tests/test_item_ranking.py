"""Ranking the beam's proposals with the item head (genrec.engine.item_ranking): exact against
an independent computation, batching, head proposals, items without a head row, the saved
item weight."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from item_head_support import N_ITEMS, head_engine
from search_reference import exhaustive_top

from genrec import BeamParams, Engine, EngineConfig
from genrec.engine import RowRequest
from genrec.engine.params import (
    DEFAULT_ITEM_WEIGHT,
    GENERATION_CONFIG,
    save_item_weight,
    saved_item_weight,
)
from genrec.model import save_model
from genrec.model.registry import build_model
from genrec.vocab.sid_vocab import SOFT_ID


def _head_logp(engine: Engine, history: list[int]) -> torch.Tensor:
    """log p_head(item) over all items, from an independent full forward of the prompt."""
    from genrec.engine.inputs import PackedInputs, build_input_embeds
    from genrec.model.layout import build_layout

    model = engine.model
    prompt = engine.vocab.prompt(history)
    inputs = PackedInputs(token_ids=torch.tensor(prompt), raw_rows=torch.zeros(0, dtype=torch.long),
                          raw_embeds=None, soft_rows=torch.zeros(0, dtype=torch.long),
                          user_vectors=None)
    layout = build_layout([len(prompt)], [], [])
    with torch.no_grad():
        hidden = model(build_input_embeds(model.model.embed_tokens, inputs, None, None),
                       layout.positions, layout)
    return torch.log_softmax(hidden[-1:] @ model.item_head.weight.T, dim=-1)[0]


@pytest.mark.parametrize("weight", [0.0, 1.0, 3.0])
def test_proposals_ranked_by_sid_plus_weighted_head(weight: float) -> None:
    engine = head_engine()
    requests = [RowRequest(history=[3, 17, 8]),
                RowRequest(history=[5, 6, 7], exclude=[0, 1, 2]),
                RowRequest(history=[20], allow=[4, 9, 30, 31, 33])]
    recs = engine.recommend_rows(requests, BeamParams(beam_width=N_ITEMS, n=5, item_weight=weight))
    for request, rec in zip(requests, recs, strict=True):
        items, sid = exhaustive_top(engine, request, N_ITEMS)  # every allowed item
        head = _head_logp(engine, list(request.history))[items]
        ref = sid + weight * head
        order = ref.argsort(descending=True)[: len(rec.items)]
        assert rec.items == items[order].tolist()
        assert torch.allclose(torch.tensor(rec.scores), ref[order].float(), atol=1e-4)
        if request.exclude:
            assert not set(rec.items) & set(request.exclude)
        if request.allow:
            assert set(rec.items) <= set(request.allow)


REQUESTS = [RowRequest(history=[3, 17, 8]),
            RowRequest(history=[5, 6, 7], exclude=[0, 1, 2]),
            RowRequest(history=[20], allow=[4, 9, 30, 31, 33])]


def test_head_proposals_reach_beyond_a_narrow_beam() -> None:
    """A narrow beam with the head proposing every item it may: the exact top over the whole
    (filtered) catalog; without head proposals, only the beam's items."""
    engine = head_engine(2)
    wide = engine.recommend_rows(REQUESTS, BeamParams(beam_width=N_ITEMS, n=5, item_weight=1.0,
                                                 head_proposals=0))
    pooled = engine.recommend_rows(REQUESTS, BeamParams(beam_width=5, n=5, item_weight=1.0,
                                                   head_proposals=N_ITEMS))
    beam_only = engine.recommend_rows(REQUESTS, BeamParams(beam_width=5, n=5, item_weight=1.0,
                                                      head_proposals=0))
    plain = engine.recommend_rows(REQUESTS, BeamParams(beam_width=5, n=5, item_weight=0.0))
    for w, p, b, s, request in zip(wide, pooled, beam_only, plain, REQUESTS, strict=True):
        assert p.items == w.items
        assert p.scores == pytest.approx(w.scores, rel=1e-6, abs=1e-4)
        assert set(b.items) == set(s.items)  # the beam's own items, reordered
        for rec in (p, b):
            assert not set(rec.items) & set(request.exclude or [])
            assert request.allow is None or set(rec.items) <= set(request.allow)


def test_batched_equals_alone() -> None:
    engine = head_engine(1)
    requests = [RowRequest(history=[3, 17, 8]), RowRequest(history=[9] * 6)]
    params = BeamParams(beam_width=8, n=5)
    together = engine.recommend_rows(requests, params)
    for request, rec in zip(requests, together, strict=True):
        [alone] = engine.recommend_rows([request], params)
        assert alone.items == rec.items
        assert alone.scores == pytest.approx(rec.scores, abs=1e-5)


def test_items_without_a_head_row_are_still_recommended() -> None:
    """Items added after training (beyond the head's rows) come from the beam, ranked with
    the lowest head score of their request."""
    engine = head_engine(3)
    cfg = dataclasses.replace(engine.model.config, item_head=N_ITEMS - 5)
    model = build_model(cfg)
    state = {k: v[: N_ITEMS - 5] if k == "item_head.weight" else v
             for k, v in engine.model.state_dict().items()}
    model.load_state_dict(state)
    small = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=engine.vocab)
    allow = [3, 36, 37, 38]
    [rec] = small.recommend_rows([RowRequest(history=[1, 2], allow=allow)],
                            BeamParams(beam_width=N_ITEMS, n=4))
    assert sorted(rec.items) == allow and all(s > float("-inf") for s in rec.scores)


def test_bad_item_weight_is_refused() -> None:
    for bad in (-1.0, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="item_weight"):
            BeamParams(item_weight=bad).validate()
    for bad in (-1, 2000, 1.5, True):
        with pytest.raises(ValueError, match="head_proposals"):
            BeamParams(head_proposals=bad).validate()


def test_the_weight_saved_with_a_model_is_its_default(tmp_path) -> None:
    engine = head_engine()
    save_model(engine.model, tmp_path)
    engine.vocab.save(tmp_path)
    assert saved_item_weight(tmp_path) is None
    assert Engine.from_pretrained(tmp_path).item_weight == DEFAULT_ITEM_WEIGHT
    save_item_weight(tmp_path, 0.25)
    assert saved_item_weight(tmp_path) == 0.25
    loaded = Engine.from_pretrained(tmp_path)
    assert loaded.item_weight == 0.25
    params = dict(beam_width=N_ITEMS, n=5)
    default = loaded.recommend_rows(REQUESTS, BeamParams(**params))
    assert default == loaded.recommend_rows(REQUESTS, BeamParams(**params, item_weight=0.25))
    assert default != loaded.recommend_rows(REQUESTS, BeamParams(**params, item_weight=3.0))
    # an engine config's own weight wins over the saved one
    mine = Engine.from_pretrained(tmp_path, config=EngineConfig(soft_token_id=SOFT_ID,
                                                                item_weight=3.0))
    assert mine.item_weight == 3.0
    (tmp_path / GENERATION_CONFIG).write_text('{"item_weight": -1}')
    with pytest.raises(ValueError, match="item_weight"):
        Engine.from_pretrained(tmp_path)
