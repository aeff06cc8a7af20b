"""Training windows: cutting users' sequences, each window's tokens and labels, packing."""

from __future__ import annotations

import pytest
import torch

from genrec.catalog.semantic_ids import with_dedup_level
from genrec.training.windows import IGNORE, make_windows, token_batches, window_tokens
from genrec.vocab.sid_vocab import BOS_ID, SOFT_ID, SidVocab


def make_vocab() -> SidVocab:
    g = torch.Generator().manual_seed(0)
    return SidVocab(with_dedup_level(torch.randint(0, 8, (60, 3), generator=g), [8, 8, 8]),
                    max_history=5)


def test_windows_overlap_by_one_and_end_at_last_item() -> None:
    items = list(range(10))
    windows = make_windows(items, max_history=3)
    assert windows == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert make_windows(items[:8], max_history=3) == [[0, 1], [1, 2, 3, 4], [4, 5, 6, 7]]
    targets = [i for w in windows for i in w[1:]]
    assert targets == items[1:]  # every item but the first is a target exactly once
    assert make_windows([3], 5) == [] and make_windows([3, 4], 5) == [[3, 4]]


@pytest.mark.parametrize("soft", [False, True])
def test_window_labels_are_the_sid_tokens_of_items_after_the_first(soft: bool) -> None:
    vocab = make_vocab()
    ids, labels, _ = window_tokens(vocab, [4, 17, 30], soft)
    head = [BOS_ID, SOFT_ID] if soft else [BOS_ID]
    sid = vocab.item_tokens([4, 17, 30]).tolist()
    assert ids == head + sid[0] + sid[1] + sid[2]
    assert ids == vocab.prompt([4, 17, 30], soft_token=soft)  # the serving prompt
    targets = [t for t in labels if t != IGNORE]
    assert targets == sid[1] + sid[2]
    # label at row p is the token at p + 1 (next-token prediction)
    assert all(labels[p] in (IGNORE, ids[p + 1]) for p in range(len(ids) - 1))
    assert labels[-1] == IGNORE


def test_token_batches_are_seeded_and_cover_every_window() -> None:
    lengths = [5, 9, 3, 12, 7, 4, 8]
    a = token_batches(lengths, 16, seed=1, epoch=0)
    assert a == token_batches(lengths, 16, seed=1, epoch=0)
    assert a != token_batches(lengths, 16, seed=1, epoch=1)
    assert sorted(i for b in a for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 16 or len(b) == 1 for b in a)
