"""Generative training data (windows, labels, packing) and loss on generated data."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genrec.catalog.semantic_ids import with_dedup_level
from genrec.data.split import training_sequences
from genrec.model import build_model
from genrec.model.checkpoint import load_model, save_model
from genrec.training.extend_vocab import adapt_pretrained
from genrec.training.generative_loss import batch_loss
from genrec.training.generative_task import GenerativeTask, scratch_config
from genrec.training.initialization import init_weights
from genrec.training.windows import IGNORE
from genrec.vocab.sid_vocab import BOS_ID, SOFT_ID, SidVocab

N_ITEMS, CLUSTERS = 60, 6


def make_vocab(max_history: int = 5, seed: int = 0) -> SidVocab:
    """Random 3x8 Semantic IDs whose first code is the item's cluster (+ dedup level)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 8, (N_ITEMS, 3), generator=g)
    codes[:, 0] = torch.arange(N_ITEMS) // (N_ITEMS // CLUSTERS)
    return SidVocab(with_dedup_level(codes, [8, 8, 8]), max_history=max_history)


def make_sequences(n_users: int = 30, seed: int = 0) -> list[list[int]]:
    """Users walk through their cluster's items in order (a learnable successor pattern)."""
    g = torch.Generator().manual_seed(seed)
    per = N_ITEMS // CLUSTERS
    out = []
    for u in range(n_users):
        start, length = torch.randint(0, per, (2,), generator=g).tolist()
        c = u % CLUSTERS
        out.append([c * per + (start + j) % per for j in range(max(4, length))])
    return out


def tiny_model(vocab: SidVocab, user_dim: int = 0, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(scratch_config(vocab, hidden=32, layers=2, heads=2, kv_heads=1,
                                       head_dim=16, user_dim=user_dim))
    init_weights(model)
    return model


def test_prompts_keep_the_last_items_and_reject_unknown_ids() -> None:
    vocab = make_vocab()
    n = vocab.index.num_items
    history = [i % n for i in range(vocab.max_history + 5)]
    kept = history[-vocab.max_history:]
    assert vocab.prompt(history) == [BOS_ID] + vocab.item_tokens(kept).reshape(-1).tolist()
    full = vocab.prompt(history, truncate=False)
    assert full == [BOS_ID] + vocab.item_tokens(history).reshape(-1).tolist()
    with pytest.raises(IndexError, match=f"item id {n}"):
        vocab.prompt([0, n])


@torch.no_grad()
def test_packed_loss_equals_separate_sequences() -> None:
    vocab = make_vocab()
    model = tiny_model(vocab)
    task = GenerativeTask(vocab, training_sequences(make_sequences(6)), batch_tokens=10_000,
                          progress=False)
    (batch,) = list(task.batches(0))
    packed = batch_loss(model, batch)
    total, count, start = 0.0, 0, 0
    for n in batch.lengths:
        part = type(batch)(batch.token_ids[start : start + n], batch.labels[start : start + n],
                           [n], batch.soft_rows[:0], None)
        k = int((part.labels != IGNORE).sum())
        total, count, start = total + float(batch_loss(model, part)) * k, count + k, start + n
    assert float(packed) == pytest.approx(total / count, rel=1e-4)


def test_a_few_steps_lower_the_loss() -> None:
    vocab = make_vocab()
    model = tiny_model(vocab)
    task = GenerativeTask(vocab, training_sequences(make_sequences()), batch_tokens=400,
                          progress=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = list(task.batches(0))
    first = float(batch_loss(model, batches[0]).detach())
    for _ in range(4):
        for batch in batches:
            loss = batch_loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert float(batch_loss(model, batches[0]).detach()) < first - 0.5


def test_soft_token_enters_the_loss_and_trains_the_projector() -> None:
    vocab = make_vocab()
    model = tiny_model(vocab, user_dim=4)
    vectors = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    seqs = training_sequences(make_sequences())
    task = GenerativeTask(vocab, seqs, vectors, batch_tokens=10_000, progress=False)
    (batch,) = list(task.batches(0))
    assert batch.soft_rows.numel() == len(batch.lengths)
    assert (batch.token_ids[batch.soft_rows] == SOFT_ID).all()
    loss = batch_loss(model, batch)
    loss.backward()
    assert model.user_projector.fc1.weight.grad.abs().sum() > 0
    other = GenerativeTask(vocab, seqs, -vectors, batch_tokens=10_000, progress=False)
    flipped = batch_loss(model, next(iter(other.batches(0)))).detach()
    assert float(flipped) != pytest.approx(float(loss.detach()))


def test_task_rejects_unknown_items_and_empty_data() -> None:
    vocab = make_vocab()
    with pytest.raises(ValueError, match=r"train_sequences\[0\]"):
        GenerativeTask(vocab, [[1, N_ITEMS]], progress=False)
    with pytest.raises(ValueError, match="no user has two"):
        GenerativeTask(vocab, [[1]], progress=False)


def test_adapt_pretrained_keeps_the_first_rows(tmp_path) -> None:
    vocab = make_vocab()
    save_model(tiny_model(vocab), tmp_path)  # an HF-format folder
    pretrained = load_model(tmp_path)
    for size in (vocab.vocab_size - 10, vocab.vocab_size + 7):
        model = adapt_pretrained(pretrained, size, user_dim=3)
        emb = model.model.embed_tokens.weight
        keep = min(size, pretrained.config.vocab_size)
        assert emb.shape[0] == size and model.config.user_dim == 3
        assert torch.equal(emb[:keep], pretrained.model.embed_tokens.weight[:keep])
        assert torch.equal(model.model.layers[0].mlp.up_proj.weight,
                           pretrained.model.layers[0].mlp.up_proj.weight)


@torch.no_grad()
def test_loss_matches_plain_cross_entropy_of_one_window() -> None:
    vocab = make_vocab()
    model = tiny_model(vocab)
    task = GenerativeTask(vocab, [[1, 2, 3]], batch_tokens=100, progress=False)
    (batch,) = list(task.batches(0))
    from genrec.model import build_layout

    layout = build_layout(batch.lengths, [], [])
    hidden = model(model.model.embed_tokens(batch.token_ids), layout.positions, layout)
    rows = batch.labels != IGNORE
    ref = F.cross_entropy(model.logits(hidden[rows]), batch.labels[rows])
    assert float(batch_loss(model, batch)) == pytest.approx(float(ref), rel=1e-5)


def test_fit_learns_the_successor_pattern_far_above_chance(tmp_path) -> None:
    from genrec.evaluation.full_catalog import split_examples
    from genrec.training.loop import LoopConfig, fit

    vocab = make_vocab()
    seqs = make_sequences(200, seed=1)
    task = GenerativeTask(vocab, training_sequences(seqs), None, 1000, 0,
                          split_examples(seqs, "val", 5, 50), progress=False)
    result = fit(tiny_model(vocab), task, tmp_path, LoopConfig(epochs=6, lr=5e-3, progress=False))
    assert result.history[-1]["val_recall@10"] > 0.5  # chance: 10 / 60


def test_finish_saves_the_best_item_weight_from_one_search(tmp_path, monkeypatch) -> None:
    from genrec import Engine, EngineConfig
    from genrec.engine.params import saved_item_weight
    from genrec.evaluation.full_catalog import evaluate_generative, split_examples

    vocab, seqs = make_vocab(), make_sequences()
    torch.manual_seed(0)
    model = build_model(scratch_config(vocab, hidden=32, layers=2, heads=2, kv_heads=1,
                                       head_dim=16, item_head=True))
    init_weights(model)
    val = split_examples(seqs, "val", vocab.max_history)
    # epochs validate 4 users, the final choice all of them (one search for every weight)
    task = GenerativeTask(vocab, training_sequences(seqs), val_examples=val[:4], beam_width=10,
                          progress=False, item_weights=(1.0, 3.0, 10.0), final_examples=val)
    assert task.final_validation is not None
    assert task.validate_final(model)["n_users"] == len(val) > task.validate(model)["n_users"]
    searches = []
    pools = Engine.head_pools
    monkeypatch.setattr(Engine, "head_pools",
                        lambda *a, **k: searches.append(1) or pools(*a, **k))
    result = task.finish(model, tmp_path)
    assert len(searches) == -(-len(val) // task.val_batch_size)
    for w in (1.0, 3.0, 10.0):  # each weight's figure: what evaluating the final sample gives
        alone = evaluate_generative(Engine(model, config=EngineConfig(soft_token_id=SOFT_ID),
                                           vocab=vocab), val, beam_width=10, item_weight=w)
        assert result["item_weights"][str(w)] == pytest.approx(alone["ndcg@10"])
    assert result["item_weights"][str(result["item_weight"])] == max(
        result["item_weights"].values())
    assert saved_item_weight(tmp_path) == result["item_weight"]
    plain = GenerativeTask(vocab, training_sequences(seqs), val_examples=val, progress=False)
    assert plain.final_validation is None  # no separate sample: the epochs' validation
    assert plain.finish(tiny_model(vocab), tmp_path) == {}  # no item head: nothing chosen
