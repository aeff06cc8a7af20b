"""The user's earlier items at each item-head target (``--mask-history`` training): the padded
matrix against a brute-force reading of the windows, the masked loss, and sharding."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from genrec.catalog.semantic_ids import SemanticIndex
from genrec.model.item_head import hide_seen
from genrec.model.registry import build_model
from genrec.training.generative_loss import batch_loss
from genrec.training.generative_task import GenerativeTask, scratch_config
from genrec.training.seen_items import seen_matrix
from genrec.training.windows import IGNORE, make_windows
from genrec.vocab.sid_vocab import SidVocab

SIZES, N_ITEMS = [4, 5, 3], 40


def _vocab(max_history: int = 3) -> SidVocab:
    g = torch.Generator().manual_seed(0)
    codes = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    return SidVocab(SemanticIndex(codes[torch.randperm(codes.shape[0], generator=g)[:N_ITEMS]],
                                  SIZES), max_history=max_history)


SEQUENCES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [5, 6, 5, 7], [10, 11]]


def test_seen_matrix_lists_every_earlier_item_of_each_target() -> None:
    task = GenerativeTask(_vocab(), SEQUENCES, batch_tokens=10_000, mask_history=True)
    batches = list(task.batches(0))
    assert len(batches) == 1
    batch = batches[0]
    # the batch's windows come shuffled: find each one among the task's windows by its tokens
    order = [next(w for w, ids in enumerate(task.ids)
                  if torch.equal(ids, batch.windows([k]).token_ids))
             for k in range(len(batch.lengths))]
    assert sorted(order) == list(range(len(task.ids)))
    per_window = []
    for seq in SEQUENCES:
        pos = 0
        for window in make_windows(seq, 3):
            per_window.append([seq[: pos + j] for j in range(1, len(window))])
            pos += len(window) - 1
    expected = [row for w in order for row in per_window[w]]
    got = [[i for i in row if i >= 0] for row in batch.seen_items.tolist()]
    assert got == expected
    assert batch.seen_items.shape[0] == int((batch.item_labels != IGNORE).sum())
    # a shard keeps exactly its windows' rows
    part = batch.windows([2, 0])
    kept = [row for w in (order[2], order[0]) for row in per_window[w]]
    assert [[i for i in row if i >= 0] for row in part.seen_items.tolist()] == kept
    assert task.batches(0).__next__().seen_items is not None
    plain = GenerativeTask(_vocab(), SEQUENCES, batch_tokens=10_000)
    assert next(plain.batches(0)).seen_items is None


def test_seen_matrix_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="firsts"):
        seen_matrix([torch.tensor([1, 2])], [1, 2])
    with pytest.raises(ValueError, match="outside"):
        seen_matrix([torch.tensor([1, 2])], [3])
    assert seen_matrix([], []).shape == (0, 0)


def test_hide_seen_masks_earlier_items_but_keeps_a_repeated_target() -> None:
    logits = torch.zeros(2, 6)
    seen = torch.tensor([[1, 3, -1], [2, 4, 5]])
    out = hide_seen(logits, torch.tensor([0, 4]), seen)
    assert torch.isinf(out[0]).tolist() == [False, True, False, True, False, False]
    assert torch.isinf(out[1]).tolist() == [False, False, True, False, False, True]


def test_masked_loss_is_cross_entropy_over_unseen_items_and_trains_the_head() -> None:
    vocab = _vocab()
    cfg = scratch_config(vocab, hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(cfg, item_head=N_ITEMS))
    masked = GenerativeTask(vocab, SEQUENCES, batch_tokens=10_000, mask_history=True)
    plain = GenerativeTask(vocab, SEQUENCES, batch_tokens=10_000)
    mb, pb = next(masked.batches(0)), next(plain.batches(0))
    assert torch.equal(mb.token_ids, pb.token_ids)
    from genrec.engine.inputs import PackedInputs, build_input_embeds
    from genrec.model.layout import build_layout

    inputs = PackedInputs(token_ids=pb.token_ids, raw_rows=torch.zeros(0, dtype=torch.long),
                          raw_embeds=None, soft_rows=pb.soft_rows, user_vectors=None)
    layout = build_layout(pb.lengths, [], [])
    with torch.no_grad():
        hidden = model(build_input_embeds(model.model.embed_tokens, inputs, None, None),
                       layout.positions, layout)
        rows = pb.item_labels != IGNORE
        logits = hidden[rows] @ model.item_head.weight.T
        targets = pb.item_labels[rows]
        # brute force: each row's softmax over the items its user has not had before it
        for r, row in enumerate(mb.seen_items.tolist()):
            for item in row:
                if item >= 0 and item != int(targets[r]):
                    logits[r, item] = float("-inf")
        expect = F.cross_entropy(logits, targets) - F.cross_entropy(
            hidden[rows] @ model.item_head.weight.T, targets)
        diff = batch_loss(model, mb) - batch_loss(model, pb)
    assert diff.item() == pytest.approx(expect.item(), rel=1e-4, abs=1e-6)
    assert diff.item() < 0  # fewer competitors, lower loss
    loss = batch_loss(model, mb)
    loss.backward()
    assert model.item_head.weight.grad.abs().sum() > 0


def test_validation_excludes_must_match_the_examples() -> None:
    with pytest.raises(ValueError, match="val_exclude"):
        GenerativeTask(_vocab(), SEQUENCES, mask_history=True, val_exclude=[[1]])
