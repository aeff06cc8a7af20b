"""The generative catalog an engine serves, as one immutable state: a *base* (the Semantic-ID
vocabulary and its trie at the last compaction) plus a small *delta* of the changes since.

A live update (:meth:`CatalogState.updated`, :mod:`genrec.live_catalog.delta`) costs what it
changes: items given a new or changed Semantic ID go to the delta (its own small trie, rebuilt per
update), their base leaves and the retired items become *dead* ranks (sorted lists the search
skips, see :mod:`genrec.catalog.filters`). Nothing of size N is copied or rebuilt. The engine
installs the new state with one reference assignment (:meth:`genrec.engine.Engine.set_catalog`)
and ``Engine.recommend`` reads it once, so a call running during an update uses the old catalog
or the new one throughout. :meth:`compacted` folds the delta into a new base (O(N log N), run in
the background by the server); :meth:`rebased` carries the updates made meanwhile onto it.

Retired items keep their row and their Semantic ID (item ids stay stable, histories that name
them still build their prompts); they are never returned, and their IDs stay taken.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genrec.catalog.filters import PartFilter, dead_edges, padded_ranks
from genrec.catalog.id_map import check_rows
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.catalog.trie import SemanticTrie
from genrec.live_catalog.delta import apply_update, member, rebase
from genrec.vocab.sid_vocab import SidVocab

_EMPTY = torch.zeros(0, dtype=torch.int64)


@dataclass(frozen=True)
class CatalogState:
    """``base_vocab`` (its index: items ``0 .. N_base-1`` at the last compaction) and its
    ``trie`` on the model's device; the delta: ``delta_items`` (sorted item ids whose Semantic
    ID is not the base's, new items included; CPU int64 [M]), ``delta_codes`` [M, L] and
    ``delta_trie`` over them (retired ones included, so their IDs stay taken); ``retired``
    (sorted item ids, CPU); ``base_dead`` / ``delta_dead``: sorted ranks no search returns
    (device), and ``base_closed`` / ``delta_closed`` their :func:`dead_edges` (per level, the
    edges with no live item); a ``version`` number. Build it with :meth:`build` or
    :meth:`updated`."""

    base_vocab: SidVocab
    trie: SemanticTrie
    retired_items: torch.Tensor = _EMPTY
    delta_items: torch.Tensor = _EMPTY
    delta_codes: torch.Tensor | None = None
    delta_trie: SemanticTrie | None = None
    base_dead: torch.Tensor = _EMPTY
    delta_dead: torch.Tensor = _EMPTY
    base_closed: tuple[torch.Tensor, ...] | None = None
    delta_closed: tuple[torch.Tensor, ...] | None = None
    version: int = 0

    @classmethod
    def build(cls, vocab: SidVocab, device: torch.device | str | None = None,
              active: torch.Tensor | None = None, version: int = 0) -> CatalogState:
        """The state of ``vocab`` with the trie on ``device`` (default: the index's);
        ``active`` bool [N] marks the live items (default: all)."""
        device = device if device is not None else vocab.index.codes.device
        trie = SemanticTrie.from_index(vocab.index).to(device)
        retired = _EMPTY
        if active is not None:
            active = torch.as_tensor(active).to(device="cpu", dtype=torch.bool)
            if tuple(active.shape) != (trie.num_items,):
                raise ValueError(f"active must be [{trie.num_items}], got {tuple(active.shape)}")
            retired = torch.nonzero(~active).flatten()
        dead = torch.sort(trie.ranks(retired)).values
        return cls(vocab, trie, retired, base_dead=dead, base_closed=dead_edges(trie, dead),
                   version=version)

    # -- what the catalog holds -------------------------------------------------------------

    @property
    def num_items(self) -> int:
        """Items in the catalog, retired ones included (valid ids are ``0 .. num_items-1``)."""
        n = self.base_vocab.index.num_items
        return max(n, int(self.delta_items[-1]) + 1) if self.delta_items.numel() else n

    @property
    def num_levels(self) -> int:
        return self.base_vocab.num_levels

    @property
    def codebook_sizes(self) -> list[int]:
        return self.base_vocab.index.codebook_sizes

    @property
    def level_offsets(self) -> list[int]:
        """First token id of each level's codes."""
        return self.base_vocab.level_offsets

    @property
    def token_count(self) -> int:
        """Tokens the vocabulary needs (special tokens and every level's codes)."""
        return self.base_vocab.vocab_size

    def retired(self) -> list[int]:
        """Ids of the retired items."""
        return self.retired_items.tolist()

    def is_active(self, item: int) -> bool:
        """Whether ``item`` (a valid id) is live."""
        return not bool(member(self.retired_items, torch.tensor([item]))[0])

    def check_items(self, items: Sequence[int], field: str) -> None:
        """Raise ValueError naming ``field`` when an item id is not in the catalog."""
        check_rows(items, self.num_items, field)

    def codes_of(self, items: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Current Semantic IDs of valid item ids [...] -> int64 [..., L] (CPU)."""
        items = torch.as_tensor(items, dtype=torch.int64).cpu()
        base = self.base_vocab.index.codes
        codes = base.cpu()[items.clamp(max=base.shape[0] - 1)]
        if self.delta_items.numel():
            pos = torch.searchsorted(self.delta_items, items).clamp(max=len(self.delta_items) - 1)
            hit = self.delta_items[pos] == items
            codes = torch.where(hit[..., None], self.delta_codes[pos], codes)
        return codes

    def item_tokens(self, items: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Token ids of items: [n] -> int64 [n, L]."""
        offsets = torch.tensor(self.level_offsets, dtype=torch.int64)
        return self.codes_of(items) + offsets

    def prompts(self, histories: Sequence[Sequence[int]], soft_tokens: Sequence[bool],
                texts: Sequence[Sequence[int] | None] | None = None) -> list[list[int]]:
        """``bos [soft] text sid(h_1) ... sid(h_n)`` per request over its last ``max_history``
        items, the current Semantic IDs (delta first), in one lookup for the batch; ``texts``
        (text token ids per request, None: the vocabulary's default text, see
        :meth:`SidVocab.head`)."""
        vocab = self.base_vocab
        keep = vocab.max_history
        cut = [list(h)[-keep:] if keep else list(h) for h in histories]
        flat = [i for h in cut for i in h]
        tokens = self.item_tokens(flat).tolist() if flat else []
        out, at = [], 0
        texts = [None] * len(cut) if texts is None else texts
        for h, soft, text in zip(cut, soft_tokens, texts, strict=True):
            head = vocab.head(soft, text)
            out.append(head + [t for row in tokens[at : at + len(h)] for t in row])
            at += len(h)
        return out

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Item id holding each code tuple [..., L] now -> int64 [...] (-1: none)."""
        codes = torch.as_tensor(codes, dtype=torch.int64)
        found = self.trie.lookup(codes).cpu()
        moved = member(self.delta_items, found.clamp(min=0)) & (found >= 0)
        found = torch.where(moved, -1, found)  # that base leaf is no longer its item's ID
        if self.delta_trie is not None:
            in_delta = self.delta_trie.lookup(codes).cpu()
            found = torch.where(in_delta >= 0, in_delta, found)
        return found

    @functools.cached_property
    def vocab(self) -> SidVocab:
        """The whole current vocabulary (the base with the delta applied: O(N) on first use
        per state; the search itself never needs it)."""
        if not self.delta_items.numel():
            return self.base_vocab
        index = self.base_vocab.index
        n = self.num_items
        codes = torch.cat([index.codes.cpu(), torch.zeros(n - index.num_items, self.num_levels,
                                                          dtype=index.codes.dtype)])
        codes[self.delta_items] = self.delta_codes.to(codes.dtype)
        names = index.item_ids
        if names is not None:
            names = [*names, *(str(i) for i in range(index.num_items, n))]
        new_index = SemanticIndex(codes, index.codebook_sizes, names, dict(index.meta))
        return dataclasses.replace(self.base_vocab, index=new_index)

    # -- search -----------------------------------------------------------------------------

    def parts(self) -> list[SemanticTrie]:
        """The tries a search walks together: the base, and the delta when there is one."""
        return [self.trie] if self.delta_trie is None else [self.trie, self.delta_trie]

    def search_filters(self, allow: Sequence[Sequence[int] | None],
                       exclude: Sequence[Sequence[int] | None]) -> list[PartFilter]:
        """One :class:`PartFilter` per part (see :meth:`parts`) for requests with these
        ``allow`` / ``exclude`` lists (``None``: no list): O(total list size)."""
        r = len(allow)
        device = self.trie.device
        # the rows' widths from the host lists: building the filters reads no device value
        widths = [max((len(x) for x in lists if x), default=0) for lists in (exclude, allow)]
        filters = []
        for trie, dead, closed in zip(self.parts(), (self.base_dead, self.delta_dead),
                                      (self.base_closed, self.delta_closed), strict=False):
            pad = trie.num_items + 1
            live = functools.partial(self._live_ranks, trie, dead, pad)
            excluded = allowed = restricted = None
            if any(e for e in exclude if e):
                excluded = padded_ranks(*live(exclude), r, pad, widths[0])
            if any(a is not None for a in allow):
                req, ranks = live(allow)
                if excluded is not None:  # allowed and not excluded
                    ranks = ranks.masked_fill(member_rows(excluded, req, ranks), pad)
                allowed = padded_ranks(req, ranks, r, pad, widths[1])
                restricted = torch.tensor([a is not None for a in allow], device=device)
            filters.append(PartFilter(dead, excluded, allowed, restricted, closed).prepare(trie))
        return filters

    def _live_ranks(self, trie: SemanticTrie, dead: torch.Tensor, pad: int,
                    lists: Sequence[Sequence[int] | None]) -> tuple[torch.Tensor, torch.Tensor]:
        # (request index, rank) of each listed item; ``pad`` where it does not live in
        # ``trie`` or is dead (fixed shapes: nothing read from the device)
        req = torch.tensor([k for k, items in enumerate(lists) for _ in items or ()],
                           dtype=torch.int64, device=trie.device)
        items = torch.tensor([int(i) for items in lists for i in items or ()],
                             dtype=torch.int64, device=trie.device)
        ranks = trie.ranks(items)
        # dead ranks include the base leaves of items moved to the delta
        gone = (ranks < 0) | member(dead, ranks)
        return req, ranks.masked_fill(gone, pad)

    def export(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every item's Semantic ID now, as compact CPU integers (int16 when every code fits,
        else int32) [N, L], and the retired item ids (sorted int64): what :meth:`restored`
        rebuilds this catalog from (O(N))."""
        dtype = torch.int16 if max(self.codebook_sizes) <= 1 << 15 else torch.int32
        return self.vocab.index.codes.cpu().to(dtype), self.retired_items.clone()

    def restored(self, codes: torch.Tensor, retired: torch.Tensor, version: int
                 ) -> CatalogState:
        """The catalog :meth:`export` gave (``codes`` [N, L], ``retired`` ids) as one compacted
        state, with this catalog's codebooks, history length, item names and device. Raises
        ``ValueError`` when the codes do not fit these codebooks or an id is out of range."""
        index = self.base_vocab.index
        codes = torch.as_tensor(codes).to(device="cpu", dtype=torch.int64)
        n = int(codes.shape[0]) if codes.dim() == 2 else 0
        names = index.item_ids
        if names is not None:
            names = [*names[:n], *(str(i) for i in range(len(names), n))]
        vocab = dataclasses.replace(self.base_vocab, index=SemanticIndex(
            codes, index.codebook_sizes, names, dict(index.meta)))
        retired = torch.as_tensor(retired, dtype=torch.int64).cpu()
        if retired.numel() and not 0 <= int(retired.min()) <= int(retired.max()) < n:
            raise ValueError(f"retired: item ids outside 0..{n - 1}")
        active = torch.ones(n, dtype=torch.bool)
        active[retired] = False
        return type(self).build(vocab, self.trie.device, active, version)

    def with_version(self, version: int) -> CatalogState:
        """The same catalog under another version number."""
        return dataclasses.replace(self, version=version)

    def updated(self, upsert: Sequence[tuple[int, Sequence[int] | None]] = (),
                retire: Sequence[int] = (), version: int | None = None,
                upsert_field: str = "items", retire_field: str = "item_ids") -> CatalogState:
        """A new state: ``upsert`` ``(item id, Semantic ID)`` pairs (entries whose Semantic ID
        is ``None`` are skipped; a known id gets the new ID and comes back if it was retired,
        new ids must extend the catalog in order: ``N, N+1, ...``), then ``retire`` ids.

        Everything is checked first; bad input raises ``ValueError`` naming the field
        (``items[3].semantic_id``, ``item_ids[0]``) and this state is left as it was. Two items
        may not share a Semantic ID (retired items keep theirs). Costs O(changes + delta)."""
        return apply_update(self, upsert, retire, version, upsert_field, retire_field)

    def compacted(self, device: torch.device | str | None = None) -> CatalogState:
        """The same catalog with the delta folded into a new base (O(N log N)), its tries on
        ``device`` (default: this state's; ``"cpu"``: built on the host alone, to be moved
        with :meth:`to`)."""
        active = torch.ones(self.num_items, dtype=torch.bool)
        active[self.retired_items] = False
        return type(self).build(self.vocab, self.trie.device if device is None else device,
                                active, self.version)

    def to(self, device: torch.device | str) -> CatalogState:
        """The same state with its tries and their rank lists on ``device``."""
        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device)

        def edges(closed: tuple[torch.Tensor, ...] | None) -> tuple[torch.Tensor, ...] | None:
            return None if closed is None else tuple(mv(t) for t in closed)

        return dataclasses.replace(
            self, trie=self.trie.to(device),
            delta_trie=None if self.delta_trie is None else self.delta_trie.to(device),
            base_dead=mv(self.base_dead), delta_dead=mv(self.delta_dead),
            base_closed=edges(self.base_closed), delta_closed=edges(self.delta_closed))

    def rebased(self, compacted: CatalogState) -> CatalogState:
        """This catalog over ``compacted`` (the compaction of an earlier state of this one):
        the updates made since carried over (O(delta))."""
        return rebase(self, compacted)


def member_rows(rows: torch.Tensor, req: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Whether ``values[i]`` is in row ``req[i]`` of ``rows`` [R, S] (sorted rows)."""
    if values.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=values.device)
    sub = rows[req]  # [M, S]
    pos = torch.searchsorted(sub, values[:, None]).clamp(max=rows.shape[1] - 1)
    return sub.gather(1, pos)[:, 0] == values
