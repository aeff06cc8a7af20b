"""A dense item head beside the Semantic IDs (SASRec's strength next to the IDs' generalisation).

One embedding per catalog item, ``weight`` [num_items, hidden]. It reads the hidden state that
predicts an item's first Semantic-ID token (the prompt's last position at serving; the last
token of each item in a training window): ``logits = hidden @ weight.T`` over every item, trained
jointly with the Semantic-ID cross-entropy (cross-entropy over all items,
:func:`item_loss`). At serving the beam's proposals are ranked by
``log p_sid(item) + weight * log p_head(item)`` (:func:`combine`), ``log p_head`` normalised over
all items of the head. Items added after training have no row: they keep their Semantic-ID score
plus the lowest head log-probability among the request's proposals.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from genrec.model.layout import Readout, prefix_last_layout, shared_layout


class ItemHead(nn.Module):
    """Item embeddings [num_items, hidden], initialised N(0, 0.02) like the decoder's."""

    def __init__(self, num_items: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_items, hidden).normal_(0.0, 0.02))

    @property
    def num_items(self) -> int:
        return int(self.weight.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, num_items] (fp32)."""
        return (hidden.to(self.weight.dtype) @ self.weight.T).float()

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """log p_head(item | hidden) over all items: [N, hidden] -> [N, num_items] (fp32)."""
        return torch.log_softmax(self.logits(hidden), dim=-1)


def pick(log_probs: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """``log_probs`` [N, num_items] at ``items`` [N, J] -> [N, J]; ids outside the head (-1
    padding, items added after training) give -inf."""
    known = (items >= 0) & (items < log_probs.shape[1])
    picked = log_probs.gather(1, torch.where(known, items, 0))
    return torch.where(known, picked, torch.full_like(picked, float("-inf")))

def item_loss(head: ItemHead, hidden: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all items of ``items`` [N] given ``hidden`` [N, hidden]."""
    return F.cross_entropy(head.logits(hidden), items)


def combine(sid_scores: torch.Tensor, head_scores: torch.Tensor, valid: torch.Tensor,
            weight: float) -> torch.Tensor:
    """Proposals' ranking scores: ``sid + weight * head`` [R, J]; ``valid`` [R, J] marks real
    proposals (others -inf). A proposal without a head row (-inf) takes the lowest finite head
    score of its request, so a new item competes on its Semantic-ID score."""
    finite = torch.isfinite(head_scores) & valid
    floor = torch.where(finite, head_scores, torch.full_like(head_scores, float("inf")))
    floor = floor.min(dim=1, keepdim=True).values
    floor = torch.where(torch.isfinite(floor), floor, torch.zeros_like(floor))
    head = torch.where(finite, head_scores, floor.expand_as(head_scores))
    out = sid_scores + weight * head
    return torch.where(valid, out, torch.full_like(out, float("-inf")))


def prompt_hidden(model: nn.Module, embeds: torch.Tensor, prefix_lens: list[int],
                  prefix_last: torch.Tensor) -> torch.Tensor:
    """The final hidden state at each prompt's last token: packed prompts embeds [T, H],
    ``prefix_last`` [R] (rows, on the device) -> [R, H] (one forward, a transient cache)."""
    cap = max(prefix_lens)
    layout = shared_layout(prefix_lens, [], [], prefix_cap=cap).to(embeds.device)
    readout = Readout(prefix_last, prefix_last_layout(prefix_lens, cap).to(embeds.device))
    return model(embeds, layout.positions, layout, readout=readout)
