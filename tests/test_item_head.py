"""The dense item head: its training targets and loss, item inputs, composed item vectors and
checkpoints (its ranking of the beam's proposals: test_item_ranking.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from item_head_support import N_ITEMS, SIZES, head_engine, inputs_model, tiny_vocab

from genrec import BeamParams, Engine, EngineConfig
from genrec.engine import RowRequest
from genrec.model import load_model, save_model
from genrec.model.item_head import HISTORY_BIAS_SCALE, ItemHead, combine, item_loss, pick
from genrec.model.registry import build_model
from genrec.training.generative_task import (
    GenerativeTask,
    batch_loss,
    scratch_config,
)
from genrec.training.windows import IGNORE, window_tokens
from genrec.vocab.sid_vocab import SOFT_ID


def test_item_labels_mark_the_row_before_each_next_item() -> None:
    vocab = tiny_vocab()
    ids, labels, items = window_tokens(vocab, [4, 17, 30], False)
    levels = vocab.num_levels
    rows = [r for r, item in enumerate(items) if item != IGNORE]
    assert [items[r] for r in rows] == [17, 30]
    # each such row's token label is the next item's first Semantic ID
    for r, item in zip(rows, [17, 30], strict=True):
        assert labels[r] == vocab.item_tokens([item])[0, 0].item()
    assert rows[1] - rows[0] == levels and len(ids) == len(items)


def test_loss_adds_item_cross_entropy_and_trains_the_head() -> None:
    vocab = tiny_vocab()
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
    engine = head_engine()
    save_model(engine.model, tmp_path)
    back = load_model(tmp_path)
    assert back.config.item_head == N_ITEMS
    assert torch.equal(back.item_head.weight, engine.model.item_head.weight)


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


def test_item_inputs_find_each_items_last_token() -> None:
    vocab = tiny_vocab()
    head = inputs_model(vocab).item_head
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
    vocab = tiny_vocab()
    model = inputs_model(vocab)
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
    cfg = scratch_config(tiny_vocab(), hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="item_inputs needs an item head"):
        dataclasses.replace(cfg, item_inputs=3)


def test_item_loss_weight_scales_the_heads_share_of_the_loss() -> None:
    vocab = tiny_vocab()
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


def test_a_bottleneck_projects_small_item_rows_everywhere_and_survives_a_checkpoint(
        tmp_path) -> None:
    vocab = tiny_vocab()
    model = inputs_model(vocab, item_dim=8)
    head = model.item_head
    assert head.weight.shape == (N_ITEMS, 8) and head.proj.shape == (8, 32)
    expected = head.weight @ head.proj  # scored and added to the input alike
    torch.testing.assert_close(head.item_vectors(), expected)
    hidden = torch.randn(3, 32)
    torch.testing.assert_close(head.logits(hidden), hidden @ expected.detach().T)
    ids = torch.tensor(vocab.prompt([3, 11]))
    torch.testing.assert_close(head.add_inputs(torch.zeros(len(ids), 32), ids)[len(ids) - 1],
                               expected[11].detach())
    # the loss trains the rows and the shared projection
    batch = next(GenerativeTask(vocab, [[1, 2, 3, 4]], batch_tokens=10_000).batches(0))
    batch_loss(model, batch).backward()
    assert head.weight.grad.abs().sum() > 0 and head.proj.grad.abs().sum() > 0
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.item_dim == 8 and torch.equal(loaded.item_head.proj, head.proj)
    params, request = BeamParams(beam_width=8, n=5, item_weight=3.0), RowRequest(history=[3, 11])
    recs = [Engine(m, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)
            .recommend_rows([request], params)[0] for m in (model, loaded)]
    assert recs[0].items == recs[1].items
    with pytest.raises(ValueError, match="item_dim"):
        dataclasses.replace(model.config, item_dim=64)
    with pytest.raises(ValueError, match="item_dim needs an item head"):
        dataclasses.replace(model.config, item_head=0, item_inputs=0, item_dim=8)


def test_composed_items_add_their_semantic_id_embeddings_and_survive_a_checkpoint(tmp_path) -> None:
    vocab = tiny_vocab()
    model = inputs_model(vocab, compose=True)
    head, table = model.item_head, model.model.embed_tokens.weight
    tokens = vocab.item_tokens(torch.arange(N_ITEMS))
    expected = head.weight + table[tokens].sum(1)
    torch.testing.assert_close(head.item_vectors(), expected)
    hidden = torch.randn(3, head.weight.shape[1])
    torch.testing.assert_close(head.logits(hidden), hidden @ expected.detach().T)
    # the loss trains the shared token embeddings through the head, only the items' tokens
    batch = next(GenerativeTask(vocab, [[1, 2, 3, 4]], batch_tokens=10_000).batches(0))
    plain = inputs_model(vocab)
    plain.load_state_dict(model.state_dict())
    assert batch_loss(model, batch).item() != pytest.approx(batch_loss(plain, batch).item())
    head.logits(hidden).sum().backward()
    touched = set(table.grad.abs().sum(1).nonzero()[:, 0].tolist())
    assert touched == set(tokens.flatten().tolist())
    # served: built once per weights, rebuilt when they change (an optimiser step, a load)
    with torch.no_grad():
        first = head.item_vectors()
        assert head.item_vectors() is first
        table[tokens[0, 0]] += 1.0
        assert not torch.equal(head.item_vectors(), first)
    # saved with the model: the config key, the same recommendations after loading
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.item_compose and loaded.item_head.composed
    request = RowRequest(history=[3, 11, 20])
    params = BeamParams(beam_width=8, n=5, item_weight=3.0)
    recs = [Engine(m, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)
            .recommend_rows([request], params)[0] for m in (model, loaded)]
    assert recs[0].items == recs[1].items
    torch.testing.assert_close(torch.tensor(recs[0].scores), torch.tensor(recs[1].scores))


def test_composing_needs_the_items_semantic_ids() -> None:
    cfg = scratch_config(tiny_vocab(), hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8,
                         item_head=True)
    with pytest.raises(ValueError, match="item_compose needs"):
        dataclasses.replace(cfg, item_compose=True)
    with pytest.raises(ValueError, match="compose"):
        ItemHead(4, 8, 0, torch.nn.Embedding(10, 8))


def test_item_input_dropout_leaves_items_out_in_training_only() -> None:
    vocab = tiny_vocab()
    model = inputs_model(vocab).eval()
    head = model.item_head
    ids = torch.tensor(vocab.prompt(list(range(6))))
    base = torch.zeros(len(ids), head.weight.shape[1])
    added = lambda: (head.add_inputs(base, ids).abs().sum(1) > 0).sum().item()  # noqa: E731
    assert added() == 6
    head.input_dropout = 1.0
    assert added() == 6  # eval mode: every item's embedding, whatever the setting
    model.train()
    assert added() == 0  # training: all left out (they enter by their Semantic IDs)
    head.input_dropout = 0.5
    torch.manual_seed(0)
    counts = {added() for _ in range(20)}
    assert min(counts) < 6 and max(counts) > 0 and len(counts) > 1


def test_history_bias_is_added_at_each_rows_own_items_and_learned() -> None:
    head = ItemHead(6, 4, history_bias=True)
    with torch.no_grad():
        head.history_bias.fill_(-2.0 / HISTORY_BIAS_SCALE)
    logits = torch.zeros(2, 6)
    seen = torch.tensor([[1, 1, 4, -1], [5, 9, -1, -1]])  # repeats count once; 9: no row
    out = head.with_history(logits, seen)
    assert out.tolist() == [[0, -2, 0, 0, -2, 0], [0, 0, 0, 0, 0, -2]]
    assert torch.equal(ItemHead(6, 4).with_history(logits, seen), logits)  # no bias: as is
    # the loss keeps the user's items in the softmax with the bias (not hidden) and learns it
    hidden = torch.randn(2, 4)
    loss = item_loss(head, hidden, torch.tensor([2, 3]), seen)
    expected = F.cross_entropy(head.with_history(head.logits(hidden), seen), torch.tensor([2, 3]))
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert head.history_bias.grad is not None and head.history_bias.grad.item() > 0
    with pytest.raises(ValueError, match="history_bias needs an item head"):
        scratch_config(tiny_vocab(), hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8,
                       history_bias=True)


def test_a_learned_history_bias_ranks_the_users_own_items_as_learned(tmp_path) -> None:
    vocab = tiny_vocab()
    torch.manual_seed(0)
    cfg = scratch_config(vocab, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                         item_head=True, history_bias=True)
    model = build_model(cfg)
    with torch.no_grad():
        model.item_head.weight.mul_(100)
    save_model(model, tmp_path)
    assert load_model(tmp_path).config.history_bias
    history = [3, 17, 8, 20]
    request = RowRequest(history=history)
    params = BeamParams(beam_width=N_ITEMS, n=10, item_weight=3.0)
    engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)
    plain = build_model(dataclasses.replace(cfg, history_bias=False))
    plain.load_state_dict(model.state_dict(), strict=False)
    [as_plain] = Engine(plain, config=EngineConfig(soft_token_id=SOFT_ID),
                        vocab=vocab).recommend_rows([request], params)
    assert engine.recommend_rows([request], params)[0] == as_plain  # a zero bias: no change
    with torch.no_grad():
        model.item_head.history_bias.fill_(-1e3)  # learned: users never take an item again
    [rec] = engine.recommend_rows([request], params)
    [masked] = engine.recommend_rows([RowRequest(history=history, exclude=history)], params)
    assert not set(rec.items) & set(history) and rec.items == masked.items
