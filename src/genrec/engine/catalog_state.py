"""The generative catalog an engine serves, as one immutable state: the Semantic-ID vocabulary
(its :class:`SemanticIndex`), the dense trie built from it and the mask of live items.

A live update (:meth:`CatalogState.updated`) validates everything, builds a complete new state
(new index, new trie, new mask) and the engine installs it with one reference assignment
(:meth:`genrec.engine.Engine.set_catalog`). ``Engine.recommend`` reads the state once, so a call
running during an update uses the old catalog or the new one throughout, never a mix.

Retired items keep their row and their Semantic ID (item ids stay stable, histories that name
them still build their prompts); they are removed from every beam search by the same item mask
as per-request ``exclude`` filters (:func:`genrec.catalog.trie.build_item_mask`), so they are
never returned. Their Semantic IDs stay taken: a new item cannot reuse one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genrec.catalog.semantic_ids import SemanticIndex, duplicate_groups
from genrec.catalog.trie import SemanticTrie, build_item_mask, ranked_prefix_counts
from genrec.generative.vocab import SidVocab


@dataclass(frozen=True)
class CatalogState:
    """``vocab`` (with its index), its ``trie`` on the model's device, ``active`` bool [N] on
    the same device (``None``: every item is live) and a ``version`` number.

    Build it with :meth:`build` (or :meth:`updated`), which also precomputes
    ``active_counts``: the ranked prefix counts of ``active`` [1, N + 1], reused by every
    unfiltered request.
    """

    vocab: SidVocab
    trie: SemanticTrie
    active: torch.Tensor | None = None
    version: int = 0
    active_counts: torch.Tensor | None = None

    @classmethod
    def build(cls, vocab: SidVocab, device: torch.device | str | None = None,
              active: torch.Tensor | None = None, version: int = 0) -> CatalogState:
        """The state of ``vocab`` with the trie on ``device`` (default: the index's)."""
        device = device if device is not None else vocab.index.codes.device
        trie = SemanticTrie.from_index(vocab.index).to(device)
        n = trie.num_items
        counts = None
        if active is not None:
            active = torch.as_tensor(active).to(device=device, dtype=torch.bool)
            if tuple(active.shape) != (n,):
                raise ValueError(f"active must be [{n}], got {tuple(active.shape)}")
            if bool(active.all()):
                active = None
            else:
                counts = ranked_prefix_counts(trie, active[None])
        return cls(vocab, trie, active, version, counts)

    @property
    def num_items(self) -> int:
        """Items in the index, retired ones included (valid ids are ``0 .. num_items-1``)."""
        return self.trie.num_items

    def retired(self) -> list[int]:
        """Ids of the retired items."""
        if self.active is None:
            return []
        return torch.nonzero(~self.active).flatten().tolist()

    def item_mask(self, allow: Sequence[Sequence[int] | None],
                  exclude: Sequence[Sequence[int] | None]) -> torch.Tensor:
        """bool [R, N]: the items each request may return (its filters and the live items)."""
        return build_item_mask(self.num_items, allow=allow, exclude=exclude,
                               device=self.trie.device, active=self.active)

    def filter_counts(self, allow: Sequence[Sequence[int] | None],
                      exclude: Sequence[Sequence[int] | None]) -> torch.Tensor | None:
        """Ranked prefix counts [R, N + 1] of :meth:`item_mask` for beam search, or ``None``
        when every request may return every item (no filter, nothing retired)."""
        if all(a is None for a in allow) and all(e is None for e in exclude):
            if self.active_counts is None:
                return None
            return self.active_counts.expand(len(allow), -1)
        return ranked_prefix_counts(self.trie, self.item_mask(allow, exclude))

    def updated(
        self, upsert: Sequence[tuple[int, Sequence[int] | None]] = (),
        retire: Sequence[int] = (), version: int | None = None,
        upsert_field: str = "items", retire_field: str = "item_ids",
    ) -> CatalogState:
        """A new state: ``upsert`` ``(item id, Semantic ID)`` pairs (entries whose Semantic ID
        is ``None`` are skipped; a known id gets the new ID and comes back if it was retired,
        new ids must extend the catalog in order: ``N, N+1, ...``), then ``retire`` ids.

        Everything is checked first; bad input raises ``ValueError`` naming the field
        (``items[3].semantic_id``, ``item_ids[0]``) and this state is left as it was. Two items
        may not share a Semantic ID (retired items keep theirs).
        """
        index = self.vocab.index
        n, levels, sizes = index.num_items, index.num_levels, index.codebook_sizes
        rows: dict[int, tuple[int, list[int]]] = {}  # item -> (position, codes)
        for k, (item, sid) in enumerate(upsert):
            if sid is None:
                continue
            where = f"{upsert_field}[{k}]"
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise ValueError(f"{where}.item_id: bad item id {item!r}")
            if item in rows:
                raise ValueError(f"{where}.item_id: item {item} is given twice (also "
                                 f"{upsert_field}[{rows[item][0]}])")
            codes = list(sid)
            if len(codes) != levels:
                raise ValueError(f"{where}.semantic_id: expected {levels} codes (one per level), "
                                 f"got {len(codes)}")
            for level, (c, size) in enumerate(zip(codes, sizes, strict=True)):
                if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < size:
                    raise ValueError(f"{where}.semantic_id[{level}]: code {c!r} is outside "
                                     f"0..{size - 1}")
            rows[item] = (k, codes)
        new_ids = sorted(i for i in rows if i >= n)
        for j, item in enumerate(new_ids):
            if item != n + j:
                raise ValueError(f"{upsert_field}[{rows[item][0]}].item_id: new items of the "
                                 f"generative catalog take the next ids in order (item {n + j} "
                                 f"comes next, got {item})")
        total = n + len(new_ids)
        for k, item in enumerate(retire):
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < total:
                raise ValueError(f"{retire_field}[{k}]: unknown item id {item!r} (the generative "
                                 f"catalog has 0..{total - 1})")
        codes = torch.cat([index.codes.cpu(), torch.zeros(len(new_ids), levels,
                                                          dtype=index.codes.dtype)])
        changed = torch.zeros(total, dtype=torch.bool)
        if rows:
            ids = torch.tensor(list(rows), dtype=torch.long)
            codes[ids] = torch.tensor([c for _, c in rows.values()], dtype=codes.dtype)
            changed[ids] = True
        for group in duplicate_groups(codes):
            mine = [i for i in group if changed[i]]
            if not mine:
                continue  # an older collision (an index that was never validated)
            item = mine[0]
            others = [i for i in group if i != item]
            other = next((i for i in others if not changed[i]), None)
            where = f"{upsert_field}[{rows[item][0]}].semantic_id"
            sid = codes[item].tolist()
            if other is not None:
                raise ValueError(f"{where}: {sid} is already the Semantic ID of item {other}"
                                 + (" (retired)" if not self.is_active(other) else ""))
            raise ValueError(f"{where}: {sid} is also given to {upsert_field}"
                             f"[{rows[others[0]][0]}]")
        active = torch.ones(total, dtype=torch.bool)
        if self.active is not None:
            active[:n] = self.active.cpu()
        active[changed] = True
        if len(retire):
            active[torch.tensor(list(retire), dtype=torch.long)] = False
        names = index.item_ids
        if names is not None:
            names = [*names, *(str(i) for i in new_ids)]
        new_index = SemanticIndex(codes, sizes, names, dict(index.meta))
        vocab = dataclasses.replace(self.vocab, index=new_index)
        return CatalogState.build(vocab, self.trie.device, active,
                                  self.version + 1 if version is None else version)

    def is_active(self, item: int) -> bool:
        """Whether ``item`` (a valid id) is live."""
        return self.active is None or bool(self.active[item])

    def with_version(self, version: int) -> CatalogState:
        """The same catalog under another version number."""
        return dataclasses.replace(self, version=version)
