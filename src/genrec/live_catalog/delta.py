"""Live updates of a :class:`~genrec.live_catalog.state.CatalogState`: validation, the next
state (a new delta and dead-rank lists: O(changes + delta), nothing of size N) and rebasing
(updates made during a compaction carried onto its result). Written against
:class:`DeltaState`, the part of a state they read, so that the state's module imports this
one and not the other way round."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

from genrec.catalog.filters import dead_edges
from genrec.catalog.id_map import check_rows
from genrec.catalog.trie import SemanticTrie

if TYPE_CHECKING:
    from genrec.vocab.sid_vocab import SidVocab


class DeltaState(Protocol):
    """What an update reads of a catalog state (a frozen dataclass: the next state is a
    ``dataclasses.replace`` of it); see ``CatalogState`` for the fields."""

    base_vocab: SidVocab
    trie: SemanticTrie
    retired_items: torch.Tensor
    delta_items: torch.Tensor
    delta_codes: torch.Tensor | None
    version: int

    @property
    def num_items(self) -> int: ...

    @property
    def num_levels(self) -> int: ...

    @property
    def codebook_sizes(self) -> list[int]: ...

    def lookup(self, codes: torch.Tensor) -> torch.Tensor: ...

    def is_active(self, item: int) -> bool: ...


State = TypeVar("State", bound=DeltaState)


def member(sorted_values: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Whether each of ``values`` is in ``sorted_values`` (1-D, sorted): bool like values."""
    if sorted_values.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    sorted_values = sorted_values.to(values.device)
    pos = torch.searchsorted(sorted_values, values).clamp(max=sorted_values.numel() - 1)
    return sorted_values[pos] == values


def _parse_upserts(state: State, upsert: Sequence[tuple[int, Sequence[int] | None]],
                   field: str) -> dict[int, tuple[int, list[int]]]:
    # item -> (position in the request, codes); every entry checked, naming its field
    levels, sizes = state.num_levels, state.codebook_sizes
    rows: dict[int, tuple[int, list[int]]] = {}
    for k, (item, sid) in enumerate(upsert):
        if sid is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(f"{field}[{k}].item_id: bad item id {item!r}")
        if item in rows:
            raise ValueError(f"{field}[{k}].item_id: item {item} is given twice (also "
                             f"{field}[{rows[item][0]}])")
        codes = list(sid)
        if len(codes) != levels:
            raise ValueError(f"{field}[{k}].semantic_id: expected {levels} codes (one per "
                             f"level), got {len(codes)}")
        for level, (c, size) in enumerate(zip(codes, sizes, strict=True)):
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < size:
                raise ValueError(f"{field}[{k}].semantic_id[{level}]: code {c!r} is outside "
                                 f"0..{size - 1}")
        rows[item] = (k, codes)
    return rows


def _check_unique(state: State, rows: dict[int, tuple[int, list[int]]],
                  field: str) -> None:
    # a new ID may not be another item's (retired ones keep theirs), nor given twice here
    if not rows:
        return
    items = list(rows)
    codes = torch.tensor([c for _, c in rows.values()], dtype=torch.int64)
    seen: dict[tuple[int, ...], int] = {}
    for item, (k, c) in rows.items():
        first = seen.setdefault(tuple(c), item)
        if first != item:
            raise ValueError(f"{field}[{rows[first][0]}].semantic_id: {c} is also given to "
                             f"{field}[{k}]")
    owners = state.lookup(codes).tolist()
    changing = set(items)
    for item, owner in zip(items, owners, strict=True):
        if owner >= 0 and owner != item and owner not in changing:
            k, c = rows[item]
            retired = " (retired)" if not state.is_active(owner) else ""
            raise ValueError(f"{field}[{k}].semantic_id: {c} is already the Semantic ID of "
                             f"item {owner}{retired}")


def apply_update(
    state: State, upsert: Sequence[tuple[int, Sequence[int] | None]],
    retire: Sequence[int], version: int | None, upsert_field: str, retire_field: str,
) -> State:
    """See :meth:`CatalogState.updated`."""
    n = state.num_items
    rows = _parse_upserts(state, upsert, upsert_field)
    new_ids = sorted(i for i in rows if i >= n)
    for j, item in enumerate(new_ids):
        if item != n + j:
            raise ValueError(f"{upsert_field}[{rows[item][0]}].item_id: new items of the "
                             f"generative catalog take the next ids in order (item {n + j} "
                             f"comes next, got {item})")
    total = n + len(new_ids)
    for k, item in enumerate(retire):
        check_rows([item], total, f"{retire_field}[{k}]")
    _check_unique(state, rows, upsert_field)
    order = sorted(rows)
    changed = torch.tensor(order, dtype=torch.int64)
    items, codes = state.delta_items, state.delta_codes
    if changed.numel():
        new_codes = torch.tensor([rows[i][1] for i in order], dtype=torch.int64)
        keep = ~member(changed, items)  # an item's latest ID wins
        old = codes[keep] if codes is not None else new_codes[:0]
        items, codes = torch.cat([items[keep], changed]), torch.cat([old, new_codes])
        items, by_item = torch.sort(items)
        codes = codes[by_item]
    retired = state.retired_items
    retired = retired[~member(changed, retired)]  # an upsert brings a retired item back
    retired = torch.unique(torch.cat([retired, torch.tensor(list(retire), dtype=torch.int64)]))
    return with_delta(state, state.base_vocab, state.trie, items, codes, retired,
                      state.version + 1 if version is None else version)


def with_delta(
    state: State, base_vocab: SidVocab, trie: SemanticTrie, items: torch.Tensor,
    codes: torch.Tensor | None, retired: torch.Tensor, version: int,
) -> State:
    """``state`` with this base, delta (``items`` sorted, their ``codes``) and retired items:
    the delta's trie, both dead-rank lists and their closed edges built (O(delta + retired))."""
    n_base = base_vocab.index.num_items
    delta_trie, delta_dead, delta_closed = None, retired[:0], None
    if items.numel():
        delta_trie = SemanticTrie.from_codes(codes, base_vocab.index.codebook_sizes,
                                             items=items).to(trie.device)
        ranks = delta_trie.ranks(retired)
        delta_dead = torch.sort(ranks[ranks >= 0]).values.to(trie.device)
        delta_closed = dead_edges(delta_trie, delta_dead)
    # the base never returns a retired item, nor the old leaf of an item in the delta
    gone = torch.cat([retired[retired < n_base], items[items < n_base]])
    base_dead = torch.unique(trie.ranks(gone))
    return dataclasses.replace(
        state, base_vocab=base_vocab, trie=trie, retired_items=retired, delta_items=items,
        delta_codes=codes if items.numel() else None, delta_trie=delta_trie,
        base_dead=base_dead, delta_dead=delta_dead.to(trie.device),
        base_closed=dead_edges(trie, base_dead), delta_closed=delta_closed, version=version)


def rebase(state: State, compacted: State) -> State:
    """See :meth:`CatalogState.rebased`: the items of ``state``'s delta whose ID is not the one
    ``compacted`` has for them (or that it lacks) form the new delta."""
    items = state.delta_items
    codes = state.delta_codes
    n_new = compacted.base_vocab.index.num_items
    if items.numel():
        known = items < n_new
        base_codes = compacted.base_vocab.index.codes.cpu()[items.clamp(max=n_new - 1)]
        differs = ~known | (base_codes != codes).any(dim=1)
        items, codes = items[differs], codes[differs]
    return with_delta(state, compacted.base_vocab, compacted.trie, items, codes,
                      state.retired_items, state.version)
