"""What the served catalog updates, as the small protocols it is coded against: the engine
that serves the generative catalog (:class:`CatalogHost`, an ``Engine``) and the ranker's
catalog updater (:class:`CatalogUpdater`, e.g. the DuoLM item store's)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from genrec.catalog.id_map import IdMap
    from genrec.live_catalog.state import CatalogState


class CatalogHost(Protocol):
    """Serves a generative catalog (``catalog``; ``None``: none) and installs a new state in
    one swap; ``device_work`` is held around device work beside its batches; ``item_table``
    is its item table (``None``: none), whose ``num_items`` names rows when nothing else
    does."""

    catalog: CatalogState | None
    item_table: Any

    def set_catalog(self, catalog: CatalogState) -> None: ...

    def device_work(self) -> contextlib.AbstractContextManager[Any]: ...


@runtime_checkable
class CatalogUpdater(Protocol):
    """Changes the served catalog; both methods return the new catalog version and raise
    ``ValueError`` naming the field for bad input. Items are rows of ``ids``, the served
    catalog's id map after the change (``None``: the rows the updater has, extended
    contiguously); it may name rows the updater has no item for (the generative catalog's)."""

    def upsert(self, items: list[dict[str, Any]], ids: IdMap | None = None) -> int: ...

    def retire(self, item_ids: list[int], ids: IdMap | None = None) -> int: ...
