"""Training windows of users' sequences: cutting, tokens and labels, packed batches.

Each user's training part is cut into windows of up to ``max_history + 1`` items, consecutive
windows sharing one item, the last window ending at the user's last training item
(:func:`make_windows`). A window is one causal sequence ``SidVocab.prompt(window)`` whose every
Semantic-ID token of items ``i_2 .. i_n`` is a target (:func:`window_tokens`); windows are
packed into steps of about ``batch_tokens`` tokens, grouped by length (:func:`token_batches`,
:class:`TrainBatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genrec.vocab.sid_vocab import SOFT_ID, SidVocab

IGNORE = -100


def make_windows(items: Sequence[int], max_history: int) -> list[list[int]]:
    """Windows of up to ``max_history + 1`` items, oldest first; consecutive windows overlap by
    one item and the last one ends at ``items[-1]``. Windows of one item (no target) are dropped."""
    if max_history < 1:
        raise ValueError(f"max_history must be >= 1, got {max_history}")
    windows, end = [], len(items)
    while end >= 2:
        start = max(0, end - max_history - 1)
        windows.append(list(items[start:end]))
        end = start + 1
    return windows[::-1]


def window_tokens(vocab: SidVocab, items: Sequence[int], soft_token: bool,
                  text: Sequence[int] | None = None) -> tuple[list, list, list]:
    """Token ids of a window's prompt (``text``: see :meth:`SidVocab.prompt`), its labels
    (next-token targets, -100 = no loss) and its item labels (the next item at each row that
    predicts an item's first Semantic ID, for the item head; -100 elsewhere)."""
    ids = vocab.prompt(items, soft_token=soft_token, truncate=False, text=text)
    first_target = len(vocab.head(soft_token, text)) + vocab.num_levels  # first token of item 2
    labels = [IGNORE] * len(ids)
    labels[first_target - 1 : -1] = ids[first_target:]
    item_labels = [IGNORE] * len(ids)
    for j, item in enumerate(items[1:]):  # the row before item j+2's first Semantic ID
        item_labels[first_target - 1 + j * vocab.num_levels] = int(item)
    return ids, labels, item_labels


@dataclass
class TrainBatch:
    """Packed windows: ``token_ids``/``labels`` [T], one length per window, soft-token rows [S]
    and their user vectors [S, user_dim] (None without soft tokens)."""

    token_ids: torch.Tensor
    labels: torch.Tensor
    lengths: list[int]
    soft_rows: torch.Tensor
    user_vectors: torch.Tensor | None
    soft_id: int = SOFT_ID
    item_labels: torch.Tensor | None = None  # [T], for a model with an item head
    seen_items: torch.Tensor | None = None  # [item targets, width]: see genrec.training.seen_items

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    def windows(self, keep: Sequence[int]) -> TrainBatch:
        """The batch of windows ``keep`` only (in that order)."""
        ends = torch.cumsum(torch.tensor(self.lengths), 0).tolist()
        starts = [e - n for e, n in zip(ends, self.lengths, strict=True)]
        rows = torch.cat([torch.arange(starts[w], ends[w]) for w in keep]) if keep else \
            torch.zeros(0, dtype=torch.long)
        ids = self.token_ids[rows]
        soft = torch.nonzero(ids == self.soft_id)[:, 0] if self.soft_rows.numel() else \
            self.soft_rows
        vectors = None if self.user_vectors is None else self.user_vectors[list(keep)]
        items = None if self.item_labels is None else self.item_labels[rows]
        seen = self.seen_items
        if seen is not None and self.item_labels is not None:  # the kept windows' target rows
            counts = [int((self.item_labels[s:e] != IGNORE).sum())
                      for s, e in zip(starts, ends, strict=True)]
            offsets = [0, *torch.cumsum(torch.tensor(counts), 0).tolist()]
            seen = torch.cat([seen[offsets[w] : offsets[w + 1]] for w in keep]) if keep \
                else seen[:0]
        return TrainBatch(ids, self.labels[rows], [self.lengths[w] for w in keep], soft, vectors,
                          self.soft_id, items, seen)


def token_batches(
    lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int, pool: int = 32,
) -> list[list[int]]:
    """Seeded batches of window indices, each up to ``batch_tokens`` tokens (a longer window is
    a batch of its own). Same (seed, epoch) -> same batches.

    Windows are shuffled, then grouped by length inside pools of about ``pool`` batches (the
    attention pads every sequence of a batch to the longest one), and the batches shuffled.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=gen).tolist()
    batches: list[list[int]] = []
    start = 0
    while start < len(order):
        end, used = start, 0
        while end < len(order) and used < pool * batch_tokens:
            used, end = used + lengths[order[end]], end + 1
        group = sorted(order[start:end], key=lengths.__getitem__)
        start = end
        current: list[int] = []
        used = 0
        for i in group:
            if current and used + lengths[i] > batch_tokens:
                batches.append(current)
                current, used = [], 0
            current.append(i)
            used += lengths[i]
        batches.append(current)
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
