"""The dense item head: its training targets and loss, checkpoints, and the ranking of the
beam's proposals (exact against an independent computation)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from search_reference import exhaustive_top

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.engine.params import (
    DEFAULT_ITEM_WEIGHT,
    GENERATION_CONFIG,
    save_item_weight,
    saved_item_weight,
)
from genrec.model import load_model, save_model
from genrec.model.item_head import ItemHead, combine, pick
from genrec.model.registry import build_model
from genrec.training.generative_task import (
    GenerativeTask,
    batch_loss,
    scratch_config,
    set_item_tokens,
)
from genrec.training.windows import IGNORE, window_tokens
from genrec.vocab.sid_vocab import SOFT_ID, SidVocab

SIZES, N_ITEMS = [4, 5, 3], 40


def _vocab() -> SidVocab:
    g = torch.Generator().manual_seed(0)
    codes = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    return SidVocab(SemanticIndex(codes[torch.randperm(codes.shape[0], generator=g)[:N_ITEMS]],
                                  SIZES), max_history=6)


def _engine(seed: int = 0) -> Engine:
    torch.manual_seed(seed)
    vocab = _vocab()
    cfg = scratch_config(vocab, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                         item_head=True)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
        model.item_head.weight.mul_(100)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)


def test_item_labels_mark_the_row_before_each_next_item() -> None:
    vocab = _vocab()
    ids, labels, items = window_tokens(vocab, [4, 17, 30], False)
    levels = vocab.num_levels
    rows = [r for r, item in enumerate(items) if item != IGNORE]
    assert [items[r] for r in rows] == [17, 30]
    # each such row's token label is the next item's first Semantic ID
    for r, item in zip(rows, [17, 30], strict=True):
        assert labels[r] == vocab.item_tokens([item])[0, 0].item()
    assert rows[1] - rows[0] == levels and len(ids) == len(items)


def test_loss_adds_item_cross_entropy_and_trains_the_head() -> None:
    vocab = _vocab()
    cfg = scratch_config(vocab, hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8)
    torch.manual_seed(0)
    plain = build_model(cfg)
    headed = build_model(dataclasses.replace(cfg, item_head=N_ITEMS))
    headed.load_state_dict(plain.state_dict(), strict=False)
    task = GenerativeTask(vocab, [[1, 2, 3, 4], [5, 6, 7]], batch_tokens=10_000)
    batch = next(task.batches(0))
    base = batch_loss(plain, batch)
    total = batch_loss(headed, batch)
    hidden_rows = batch.item_labels != IGNORE
    assert int(hidden_rows.sum()) == 5  # 3 + 2 next items
    # the difference is exactly the item head's cross-entropy at those rows
    from genrec.engine.inputs import PackedInputs, build_input_embeds
    from genrec.model.layout import build_layout

    inputs = PackedInputs(token_ids=batch.token_ids, raw_rows=torch.zeros(0, dtype=torch.long),
                          raw_embeds=None, soft_rows=batch.soft_rows, user_vectors=None)
    layout = build_layout(batch.lengths, [], [])
    hidden = headed(build_input_embeds(headed.model.embed_tokens, inputs, None, None),
                    layout.positions, layout)
    expect = F.cross_entropy(hidden[hidden_rows] @ headed.item_head.weight.T,
                             batch.item_labels[hidden_rows])
    assert (total - base).item() == pytest.approx(expect.item(), rel=1e-5)
    total.backward()
    assert headed.item_head.weight.grad is not None and headed.item_head.weight.grad.abs().sum() > 0
    # a shard keeps its windows' item labels
    part = batch.windows([1])
    assert part.item_labels.tolist() == batch.item_labels.tolist()[-len(part.token_ids):]


def test_checkpoint_keeps_the_head(tmp_path) -> None:
    engine = _engine()
    save_model(engine.model, tmp_path)
    back = load_model(tmp_path)
    assert back.config.item_head == N_ITEMS
    assert torch.equal(back.item_head.weight, engine.model.item_head.weight)


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
    engine = _engine()
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
    engine = _engine(2)
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
    engine = _engine(1)
    requests = [RowRequest(history=[3, 17, 8]), RowRequest(history=[9] * 6)]
    params = BeamParams(beam_width=8, n=5)
    together = engine.recommend_rows(requests, params)
    for request, rec in zip(requests, together, strict=True):
        [alone] = engine.recommend_rows([request], params)
        assert alone.items == rec.items
        assert alone.scores == pytest.approx(rec.scores, abs=1e-5)


def test_item_head_log_probs_and_new_items() -> None:
    head = ItemHead(6, 4)
    hidden = torch.randn(2, 4)
    items = torch.tensor([[0, 5, 6, -1], [2, 2, 3, 7]])
    logp = pick(head.log_probs(hidden), items)
    full = torch.log_softmax(hidden @ head.weight.detach().T, -1)
    assert torch.allclose(logp[0, :2], full[0, [0, 5]])
    assert torch.isinf(logp[0, 2:]).all() and torch.isinf(logp[1, 3])
    # an item without a head row competes with the lowest head score of its request
    sid = torch.zeros(2, 4)
    valid = items >= 0
    out = combine(sid, logp, valid, 1.0)
    assert out[0, 2] == logp[0, :2].min() and out[0, 3] == float("-inf")
    assert out[1, 3] == logp[1, :3].min()


def test_items_without_a_head_row_are_still_recommended() -> None:
    """Items added after training (beyond the head's rows) come from the beam, ranked with
    the lowest head score of their request."""
    engine = _engine(3)
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


def _inputs_model(vocab: SidVocab, seed: int = 0):  # noqa: ANN202
    torch.manual_seed(seed)
    cfg = scratch_config(vocab, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                         item_head=True, item_inputs=True)
    model = build_model(cfg)
    set_item_tokens(model, vocab)
    return model


def test_item_inputs_find_each_items_last_token() -> None:
    vocab = _vocab()
    head = _inputs_model(vocab).item_head
    history = [4, 17, 30, 4]
    ids = vocab.prompt(history) + [0] + vocab.prompt([9])  # two packed prompts
    found = head.input_items(torch.tensor(ids)).tolist()
    levels, start = vocab.num_levels, len(vocab.head(False))
    expected = [-1] * len(ids)
    for j, item in enumerate(history):
        expected[start + (j + 1) * levels - 1] = item
    expected[len(ids) - 1] = 9
    assert found == expected
    # a tuple of level tokens that is no item's ID is not an item
    taken = {tuple(r) for r in vocab.index.codes.tolist()}
    free = next(c for c in torch.cartesian_prod(*[torch.arange(k) for k in SIZES]).tolist()
                if tuple(c) not in taken)
    tokens = [vocab.level_offsets[lvl] + c for lvl, c in enumerate(free)]
    assert head.input_items(torch.tensor(tokens)).tolist() == [-1] * levels


def test_item_inputs_add_the_tied_embedding_and_survive_a_checkpoint(tmp_path) -> None:
    vocab = _vocab()
    model = _inputs_model(vocab)
    plain = build_model(dataclasses.replace(model.config, item_inputs=0))
    plain.load_state_dict(model.state_dict(), strict=False)
    from genrec.engine.inputs import PackedInputs, build_input_embeds

    ids = torch.tensor(vocab.prompt([3, 11]))
    inputs = PackedInputs(token_ids=ids, raw_rows=torch.zeros(0, dtype=torch.long),
                          raw_embeds=None, soft_rows=torch.zeros(0, dtype=torch.long),
                          user_vectors=None)
    with_items = build_input_embeds(model.model.embed_tokens, inputs, None, None, model.item_head)
    without = build_input_embeds(plain.model.embed_tokens, inputs, None, None, plain.item_head)
    delta = with_items - without
    ends = [len(ids) - vocab.num_levels - 1, len(ids) - 1]
    torch.testing.assert_close(delta[ends], model.item_head.weight[[3, 11]].detach())
    assert delta.abs().sum(1).nonzero()[:, 0].tolist() == ends
    # the loss reads them: the input use trains the head rows of history items
    task = GenerativeTask(vocab, [[1, 2, 3, 4]], batch_tokens=10_000)
    batch = next(task.batches(0))
    assert batch_loss(model, batch).item() != pytest.approx(batch_loss(plain, batch).item())
    # saved with the model (config key + item tokens): the same recommendations after loading
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.item_inputs == vocab.num_levels
    assert torch.equal(loaded.item_head.item_tokens, model.item_head.item_tokens)
    request = RowRequest(history=[3, 11, 20])
    params = BeamParams(beam_width=8, n=5)
    before = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)
    after = Engine(loaded, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)
    a = before.recommend_rows([request], params)[0]
    b = after.recommend_rows([request], params)[0]
    assert a.items == b.items
    torch.testing.assert_close(torch.tensor(a.scores), torch.tensor(b.scores))


def test_item_inputs_need_the_head() -> None:
    cfg = scratch_config(_vocab(), hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="item_inputs needs an item head"):
        dataclasses.replace(cfg, item_inputs=3)


def test_item_loss_weight_scales_the_heads_share_of_the_loss() -> None:
    vocab = _vocab()
    cfg = scratch_config(vocab, hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8)
    torch.manual_seed(0)
    plain = build_model(cfg)
    headed = build_model(dataclasses.replace(cfg, item_head=N_ITEMS))
    headed.load_state_dict(plain.state_dict(), strict=False)
    batch = next(GenerativeTask(vocab, [[1, 2, 3, 4], [5, 6, 7]], batch_tokens=10_000)
                 .batches(0))
    with torch.no_grad():
        base = batch_loss(plain, batch)
        one = batch_loss(headed, batch) - base
        three = batch_loss(headed, batch, item_weight=3.0) - base
    assert three.item() == pytest.approx(3 * one.item(), rel=1e-5)
    task = GenerativeTask(vocab, [[1, 2, 3, 4]], batch_tokens=10_000, item_loss_weight=3.0)
    loss, _ = task.loss(headed, next(task.batches(0)))
    assert loss.item() == pytest.approx(batch_loss(headed, next(task.batches(0)), vocab,
                                                   3.0).item())
    with pytest.raises(ValueError, match="item_loss_weight"):
        GenerativeTask(vocab, [[1, 2, 3, 4]], item_loss_weight=0.0)


def test_the_weight_saved_with_a_model_is_its_default(tmp_path) -> None:
    engine = _engine()
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
