"""A dense item head beside the Semantic IDs (SASRec's strength next to the IDs' generalisation).

One embedding per catalog item, ``weight`` [num_items, hidden]. It reads the hidden state that
predicts an item's first Semantic-ID token (the prompt's last position at serving; the last
token of each item in a training window): ``logits = hidden @ weight.T`` over every item, trained
jointly with the Semantic-ID cross-entropy (cross-entropy over all items,
:func:`item_loss`). At serving the beam's proposals are ranked by
``log p_sid(item) + weight * log p_head(item)`` (:func:`combine`), ``log p_head`` normalised over
all items of the head. Items added after training have no row: they keep their Semantic-ID score
plus the lowest head log-probability among the request's proposals.

With item inputs (``ModelConfig.item_inputs`` = the number of Semantic-ID levels), the same
embeddings also enter the input, tied as in SASRec: the input embedding of each item's last
Semantic-ID token gets ``weight[item]`` added. The head keeps the training index's ID of every
item (``item_tokens`` [num_items, levels], saved with the model) and finds items in any packed
token sequence by their exact token tuple (:meth:`ItemHead.input_items`), so prompts need no
item ids beside their tokens and training and serving read the same rows.

Composed (``ModelConfig.item_compose``): the head scores each item with its own row plus the sum
of its Semantic-ID tokens' input embeddings (the decoder's ``embed_tokens``, not a copy), so
items that share ID prefixes share what they learn, as Semantic-ID embeddings do for rare
items; an item's input stays its own row (its tokens already enter as themselves).

With a bottleneck (``ModelConfig.item_dim`` below the hidden size) each item keeps a row of
``item_dim`` numbers, ``weight`` [num_items, item_dim], and one shared ``proj`` [item_dim,
hidden] maps it to the hidden size wherever a row is used (scored or added to the input): fewer
parameters per item, as SASRec's small item embeddings have.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from genrec.model.layers import derived
from genrec.model.layout import Readout, prefix_last_layout, shared_layout

# logits per unit of ItemHead.history_bias
HISTORY_BIAS_SCALE = 10.0


class ItemHead(nn.Module):
    """Item embeddings [num_items, hidden], initialised N(0, 0.02) like the decoder's;
    ``levels`` > 0 also keeps each item's Semantic-ID tokens for item inputs; ``compose``: the
    decoder's token embedding, whose rows of an item's tokens join its head vector;
    ``history_bias``: a learned scalar added to the logits of the user's own items; ``dim``
    (0: ``hidden``): the rows' size, projected to ``hidden`` by ``proj`` when smaller (the item
    vectors still start at N(0, 0.02))."""

    def __init__(self, num_items: int, hidden: int, levels: int = 0,
                 compose: nn.Embedding | None = None, history_bias: bool = False,
                 dim: int = 0) -> None:
        super().__init__()
        dim = dim or hidden
        if dim > hidden:
            raise ValueError(f"item head: rows of {dim} above the hidden size {hidden}")
        self.weight = nn.Parameter(torch.empty(num_items, dim).normal_(0.0, 0.02))
        # [dim, hidden]; a plain parameter (not nn.Linear) so that the decoder's N(0, 0.02)
        # initialisation leaves it at unit gain: a projected row keeps the row's scale
        self.proj = (nn.Parameter(torch.randn(dim, hidden) / math.sqrt(dim))
                     if dim < hidden else None)
        if levels:
            self.register_buffer("item_tokens", torch.full((num_items, levels), -1))
        else:
            self.item_tokens = None
        if compose is not None and not levels:
            raise ValueError("compose: a composed item head needs the items' Semantic IDs")
        # held in a tuple: the decoder owns (and saves) the embedding, the head only reads it
        self._compose = (compose,) if compose is not None else ()
        # in units of HISTORY_BIAS_SCALE logits: Adam moves a parameter about lr per step, too
        # slowly for one scalar whose right value may be tens of logits
        # [1], not a scalar: FSDP shards no 0-d parameter
        self.history_bias = nn.Parameter(torch.zeros(1)) if history_bias else None
        # training only, not saved: the share of items whose input embedding is left out
        self.input_dropout = 0.0
        self._lookup: tuple[torch.Tensor, ...] | None = None  # built from item_tokens on use

    @property
    def item_inputs(self) -> bool:
        return self.item_tokens is not None

    def set_item_tokens(self, tokens: torch.Tensor) -> None:
        """The Semantic-ID tokens of every item, [num_items, levels] (distinct rows)."""
        if self.item_tokens is None or tokens.shape != self.item_tokens.shape:
            raise ValueError(f"item tokens: expected shape {tuple(self.item_tokens.shape)} "
                             f"(item inputs on), got {tuple(tokens.shape)}")
        self.item_tokens.copy_(tokens)
        self._lookup = None

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super()._load_from_state_dict(*args, **kwargs)
        self._lookup = None

    def _keys(self) -> tuple[torch.Tensor, ...]:
        """(sorted keys [N], their items [N], low token, span, powers [levels]): an item's key
        is its tokens read as digits in base ``span`` above ``low`` (exact, no hashing)."""
        tokens = self.item_tokens
        if self._lookup is not None and self._lookup[0].device == tokens.device:
            return self._lookup
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0:
            raise ValueError("item tokens: not set (ItemHead.set_item_tokens)")
        span, levels = high - low + 1, tokens.shape[1]
        if span ** levels >= 2 ** 62:
            raise ValueError(f"item tokens: {levels} levels over {span} token ids do not fit "
                             "an int64 key")
        powers = span ** torch.arange(levels, device=tokens.device)
        keys, order = torch.sort(((tokens - low) * powers).sum(1))
        if bool((keys[1:] == keys[:-1]).any()):
            raise ValueError("item tokens: two items share a Semantic ID")
        self._lookup = (keys, order, torch.tensor(low), torch.tensor(span), powers)
        return self._lookup

    def input_items(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The item whose last Semantic-ID token each position holds: packed ``token_ids`` [T]
        -> [T] item rows, -1 where the position does not end a known item's token tuple."""
        keys, order, low, span, powers = self._keys()
        levels = int(powers.numel())
        out = torch.full_like(token_ids, -1)
        if token_ids.numel() < levels:
            return out
        windows = token_ids.unfold(0, levels, 1) - low.to(token_ids.device)  # [T-L+1, L]
        inside = ((windows >= 0) & (windows < span.to(token_ids.device))).all(1)
        key = (windows.clamp(min=0) * powers).sum(1)
        at = torch.searchsorted(keys, key).clamp(max=keys.numel() - 1)
        found = inside & (keys[at] == key)
        out[levels - 1:] = torch.where(found, order[at], out[levels - 1:])
        return out

    def add_inputs(self, embeds: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """``embeds`` [T, hidden] with ``weight[item]`` added at each item's last token (in
        training, each left out with probability ``input_dropout``: that item then enters by
        its Semantic IDs alone, as an item added after training does)."""
        items = self.input_items(token_ids.to(embeds.device))
        at = torch.nonzero(items >= 0)[:, 0]
        if self.training and self.input_dropout:
            at = at[torch.rand(at.numel(), device=at.device) >= self.input_dropout]
        if not at.numel():
            return embeds
        return embeds.index_add(0, at, self._project(self.weight[items[at]]).to(embeds.dtype))

    def _project(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows of ``weight`` [N, dim] -> [N, hidden]."""
        return rows if self.proj is None else rows @ self.proj

    @property
    def num_items(self) -> int:
        return int(self.weight.shape[0])

    @property
    def composed(self) -> bool:
        return bool(self._compose)

    def item_vectors(self) -> torch.Tensor:
        """The vectors the head scores items with: [num_items, hidden], each item's (projected)
        row plus, composed, the sum of its Semantic-ID tokens' embeddings."""
        if not self._compose and self.proj is None:
            return self.weight
        params = [self.weight] + ([self.proj] if self.proj is not None else [])
        if self._compose:
            params += [self._compose[0].weight, self.item_tokens]

        def build() -> tuple[torch.Tensor]:
            vectors = self._project(self.weight)
            if not self._compose:
                return (vectors,)
            table, tokens = self._compose[0].weight, self.item_tokens
            if int(tokens.min()) < 0:
                raise ValueError("item tokens: not set (ItemHead.set_item_tokens)")
            shared = F.embedding_bag(tokens, table, mode="sum")  # [num_items, hidden]
            return (vectors + shared.to(vectors.dtype),)

        # served: built once per weights, not per request (rebuilt when they change)
        return derived(self, "item_vectors", params, build)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, num_items] (fp32)."""
        return (hidden.to(self.weight.dtype) @ self.item_vectors().T).float()

    def log_probs(self, hidden: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """log p_head(item | hidden) over all items: [N, hidden] -> [N, num_items] (fp32);
        ``seen`` [N, width] (-1 padding): each row's own items, given the history bias."""
        return torch.log_softmax(self.with_history(self.logits(hidden), seen), dim=-1)

    def with_history(self, logits: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
        """``logits`` [N, num_items] plus the history bias at each row's ``seen`` items
        ([N, width], -1 padding; ids beyond the head ignored); unchanged without a bias."""
        if self.history_bias is None or seen is None or not seen.numel():
            return logits
        if seen.shape[0] != logits.shape[0]:
            raise ValueError(f"seen: {seen.shape[0]} rows for {logits.shape[0]}")
        seen = seen.to(logits.device)
        known = (seen >= 0) & (seen < logits.shape[1])
        rows = torch.arange(seen.shape[0], device=seen.device)[:, None].expand_as(seen)[known]
        items = seen[known]
        bias = HISTORY_BIAS_SCALE * self.history_bias.to(logits.dtype)
        # one copy of the logits; an item listed twice gets the same value twice (added once)
        return logits.index_put((rows, items), logits[rows, items] + bias)


def pick(log_probs: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """``log_probs`` [N, num_items] at ``items`` [N, J] -> [N, J]; ids outside the head (-1
    padding, items added after training) give -inf."""
    known = (items >= 0) & (items < log_probs.shape[1])
    picked = log_probs.gather(1, torch.where(known, items, 0))
    return torch.where(known, picked, torch.full_like(picked, float("-inf")))


def hide_seen(logits: torch.Tensor, targets: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """``logits`` [N, num_items] with each row's ``seen`` items [N, width] (-1 padding) at -inf,
    its target [N] kept."""
    if seen.shape[0] != logits.shape[0]:
        raise ValueError(f"seen: {seen.shape[0]} rows for {logits.shape[0]} targets")
    hide = torch.zeros_like(logits, dtype=torch.bool)
    index = torch.where(seen >= 0, seen, targets[:, None]).to(logits.device)
    hide.scatter_(1, index, True)
    hide[torch.arange(logits.shape[0], device=logits.device), targets] = False
    return logits.masked_fill(hide, float("-inf"))


def item_logits(head: ItemHead, hidden: torch.Tensor, items: torch.Tensor,
                seen: torch.Tensor | None = None) -> torch.Tensor:
    """The logits the head is trained on: ``hidden`` [N, hidden] -> [N, num_items] (fp32);
    ``seen`` [N, width] (-1 padding): each row's earlier items (:mod:`genrec.training.seen_items`),
    which get the head's history bias where it has one, else are left out of the softmax (each
    row's target ``items`` [N] kept)."""
    logits = head.logits(hidden)
    if seen is not None and head.history_bias is not None:
        return head.with_history(logits, seen)
    if seen is not None:
        return hide_seen(logits, items, seen)
    return logits


def item_loss(head: ItemHead, hidden: torch.Tensor, items: torch.Tensor,
              seen: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over all items of ``items`` [N] given ``hidden`` [N, hidden], the
    logits of :func:`item_logits`."""
    return F.cross_entropy(item_logits(head, hidden, items, seen), items)


def head_floor(head_scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``head_scores`` [R, J] where a proposal without a head row (-inf) takes the lowest
    finite head score of its request's ``valid`` [R, J] proposals (0 if none has one), so a new
    item competes on its Semantic-ID score."""
    finite = torch.isfinite(head_scores) & valid
    floor = torch.where(finite, head_scores, torch.full_like(head_scores, float("inf")))
    floor = floor.min(dim=1, keepdim=True).values
    floor = torch.where(torch.isfinite(floor), floor, torch.zeros_like(floor))
    return torch.where(finite, head_scores, floor.expand_as(head_scores))


def combine(sid_scores: torch.Tensor, head_scores: torch.Tensor, valid: torch.Tensor,
            weight: float) -> torch.Tensor:
    """Proposals' ranking scores: ``sid + weight * head`` [R, J], the head's missing rows
    filled by :func:`head_floor`; ``valid`` [R, J] marks real proposals (others -inf)."""
    out = sid_scores + weight * head_floor(head_scores, valid)
    return torch.where(valid, out, torch.full_like(out, float("-inf")))


def prompt_hidden(model: nn.Module, embeds: torch.Tensor, prefix_lens: list[int],
                  prefix_last: torch.Tensor) -> torch.Tensor:
    """The final hidden state at each prompt's last token: packed prompts embeds [T, H],
    ``prefix_last`` [R] (rows, on the device) -> [R, H] (one forward, a transient cache)."""
    cap = max(prefix_lens)
    layout = shared_layout(prefix_lens, [], [], prefix_cap=cap).to(embeds.device)
    readout = Readout(prefix_last, prefix_last_layout(prefix_lens, cap).to(embeds.device))
    return model(embeds, layout.positions, layout, readout=readout)
