"""The served catalog: the generative engine's catalog and the ranker's item table, updated
together, all or nothing, under one version number.

An upsert item goes to

- the **generative catalog** (Semantic-ID index, trie, live items of the engine) when it has a
  ``semantic_id`` (one code per level); without one the generative model cannot produce it;
- the **ranker** (through its :class:`~genrec.serving.backends.CatalogUpdater`, e.g. item text
  encoded by the DuoLM item encoder) when it has any other field (``text``, ``vectors``...) or no
  ``semantic_id``.

A retire goes to the generative catalog (the ids it knows) and to the ranker (all ids).

All or nothing: the new generative state is validated and built first (nothing installed),
then the ranker updater runs (it validates everything before its own one swap), and only then
is the generative state installed, by one reference assignment that cannot fail. If either
step raises, neither catalog changes. Updates run on the engine's worker thread between
batches (see :func:`genrec.serving.backends.make_runner`), so no batch sees one catalog
updated and not the other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrec.engine import Engine
    from genrec.serving.backends import CatalogUpdater

GENERATIVE, RANKER = "generative", "ranker"


@dataclass
class CatalogChange:
    """The result of one update: the new service catalog version, and for each catalog that
    changed (``"generative"``, ``"ranker"``) the item ids it took."""

    version: int
    catalogs: dict[str, list[int]] = field(default_factory=dict)


class ServiceCatalog:
    """One version number over the engine's generative catalog and an optional ranker
    catalog updater. ``catalog_version`` starts at ``version`` and grows by one per update
    (never falling behind the version the ranker's updater reports, so with a DuoLM ranker it
    equals the ranker table's version as long as every update touches the ranker)."""

    def __init__(self, engine: Engine, ranker_updater: CatalogUpdater | None = None,
                 version: int = 0) -> None:
        self.engine, self.ranker_updater = engine, ranker_updater
        self._version = int(version)
        self._lock = threading.Lock()  # serialises updates; readers never wait

    @property
    def catalog_version(self) -> int:
        """The version being served."""
        return self._version

    @property
    def generative(self) -> bool:
        """Whether the engine has a generative catalog to update."""
        return self.engine.catalog is not None

    @staticmethod
    def for_ranker(item: dict[str, Any]) -> bool:
        """Whether an upsert item goes to the ranker: it has no ``semantic_id`` or it has
        other fields (text, vectors...)."""
        return item.get("semantic_id") is None or bool(set(item) - {"item_id", "semantic_id"})

    def split(self, items: list[dict[str, Any]]) -> tuple[list[tuple[int, list[int] | None]],
                                                          list[dict[str, Any]]]:
        """``(item id, Semantic ID or None)`` per item, and the items for the ranker (without
        ``semantic_id``). Raises ``ValueError`` naming the field for duplicate ids."""
        seen: dict[int, int] = {}
        for k, item in enumerate(items):
            i = item["item_id"]
            if i in seen:
                raise ValueError(f"items[{k}].item_id: item {i} is given twice (also "
                                 f"items[{seen[i]}])")
            seen[i] = k
        sids = [(it["item_id"], it.get("semantic_id")) for it in items]
        ranker = [{key: v for key, v in it.items() if key != "semantic_id"} for it in items
                  if self.for_ranker(it)]
        return sids, ranker

    def check(self, items: list[dict[str, Any]]) -> None:
        """What this server cannot do at all (raises ``LookupError`` naming the field):
        Semantic IDs without a generative model, ranker items without a ranker updater."""
        for k, item in enumerate(items):
            if item.get("semantic_id") is not None and not self.generative:
                raise LookupError(f"items[{k}].semantic_id: this model has no Semantic-ID "
                                  f"vocabulary (not a generative model)")
            if self.ranker_updater is None and self.for_ranker(item):
                raise LookupError(f"items[{k}]: no ranker catalog to update (the server has no "
                                  f"catalog updater); an item of the generative catalog takes "
                                  f"only 'item_id' and 'semantic_id'")

    def upsert(self, items: list[dict[str, Any]]) -> CatalogChange:
        """Add or replace items (see the module docstring); returns the change."""
        self.check_input(items)
        sids, ranker_items = self.split(items)
        with self._lock:
            state = None
            if any(sid is not None for _, sid in sids):
                state = self.engine.catalog.updated(sids)  # validated, built, not installed
            reported = self.ranker_updater.upsert(ranker_items) if ranker_items else None
            change = self._commit(state, reported)
        if state is not None:
            change.catalogs[GENERATIVE] = [i for i, sid in sids if sid is not None]
        if ranker_items:
            change.catalogs[RANKER] = [it["item_id"] for it in ranker_items]
        return change

    def check_input(self, items: list[dict[str, Any]]) -> None:
        """:meth:`check`, raising ``ValueError`` (bad input for this server)."""
        try:
            self.check(items)
        except LookupError as err:
            raise ValueError(str(err)) from None

    def retire(self, item_ids: list[int]) -> CatalogChange:
        """Retire items from the generative catalog (the ids it has; every id when there is no
        ranker) and from the ranker (every id)."""
        item_ids = list(item_ids)
        with self._lock:
            catalog = self.engine.catalog
            if self.ranker_updater is None:
                if catalog is None:
                    raise ValueError("item_ids: no catalog to retire items from")
                mine = item_ids  # each must be known here: updated() names unknown ones
            else:
                mine = [i for i in item_ids if catalog is not None and 0 <= i < catalog.num_items]
            state = catalog.updated(retire=mine) if mine else None
            reported = self.ranker_updater.retire(item_ids) if self.ranker_updater else None
            change = self._commit(state, reported)
        if state is not None:
            change.catalogs[GENERATIVE] = mine
        if self.ranker_updater is not None:
            change.catalogs[RANKER] = item_ids
        return change

    def _commit(self, state: Any, reported: Any) -> CatalogChange:
        """Install the generative ``state`` (if any) under the next version; under the lock,
        after every fallible step."""
        version = self._version + 1
        if reported is not None:
            reported = reported.version if isinstance(reported, CatalogChange) else reported
            version = max(version, int(reported))
        if state is not None:
            self.engine.set_catalog(state.with_version(version))  # the one swap readers see
        self._version = version
        return CatalogChange(version)
