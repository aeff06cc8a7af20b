"""The items a user already has at each item-head target of a training window.

Serving that never recommends an item the user already has (``RecommendRequest.exclude``,
``genrec eval --mask-history``) ranks only unseen items, so the item head can be trained the
same way (``genrec train generative --mask-history``): the softmax over items at a target
leaves out every earlier item of the user, the target itself excepted
(:func:`genrec.model.item_head.item_loss` with ``seen``, which hides them).

A window of ``n`` items starting at item ``start`` of its user's sequence has targets
``j = 1 .. n-1``; target ``j`` has seen ``seq[: start + j]`` (all earlier items, not only the
window's). Each window keeps one view ``seq[: start + n - 1]`` and its first count
``start + 1``; a batch expands them to a padded matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

PAD = -1


def seen_matrix(priors: Sequence[torch.Tensor], firsts: Sequence[int]) -> torch.Tensor:
    """Per target of each window, in window order then target order: the user's earlier items,
    [sum targets, width] padded with -1 (``width`` = the longest prior).

    ``priors[w]``: the user's items before window ``w``'s last item; ``firsts[w]``: how many of
    them its first target has seen (the window's start + 1)."""
    if len(priors) != len(firsts):
        raise ValueError(f"firsts: {len(firsts)} entries for {len(priors)} windows")
    width = max((int(p.numel()) for p in priors), default=0)
    rows = [torch.zeros(0, width, dtype=torch.long)]
    for prior, first in zip(priors, firsts, strict=True):
        size = int(prior.numel())
        if not 1 <= first <= size:
            raise ValueError(f"firsts: {first} outside 1..{size}")
        counts = torch.arange(first, size + 1)  # [targets]: target j has seen start + j items
        keep = torch.arange(width)[None, :] < counts[:, None]  # [targets, width]
        padded = F.pad(prior.long(), (0, width - size), value=PAD)
        rows.append(torch.where(keep, padded.expand(counts.numel(), width),
                                torch.full((), PAD)))
    return torch.cat(rows)

