"""One update of the served catalog, planned on both catalogs before anything is installed.

An upsert item goes to

- the **generative catalog** (Semantic-ID index, trie, live items of the engine) when it has a
  ``semantic_id`` (one code per level); without one the generative model cannot produce it;
- the **ranker** (through its :class:`~genrec.live_catalog.host.CatalogUpdater`, e.g. item
  text encoded by the DuoLM item encoder) when it has any other field (``text``,
  ``vectors``...) or no ``semantic_id``.

A retire goes to the generative catalog (the ids it knows) and to the ranker (all ids). Here:
the next generative state (:func:`next_generative`), the ranker's items and its updater's
call (:func:`ranker_items`, :func:`run_ranker`), and what each catalog took
(:func:`record_taken`); :class:`PreparedUpdate` is an update so planned,
:class:`CatalogChange` the answer of one installed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genrec.live_catalog.items import split_items

if TYPE_CHECKING:
    from genrec.catalog.id_map import IdMap
    from genrec.live_catalog.host import CatalogUpdater
    from genrec.live_catalog.ids import RowUpdate
    from genrec.live_catalog.state import CatalogState

GENERATIVE, RANKER = "generative", "ranker"


@dataclass(frozen=True)
class PreparedUpdate:
    """An update checked and its next generative state built
    (:meth:`~genrec.live_catalog.served.ServiceCatalog.prepare`) from ``base`` and
    ``base_ids``, the state and id map installed then: ``data`` as given (the table's ids),
    ``rows`` the same in rows; ``state`` is ``None`` when the generative catalog does not
    change, ``generative`` the rows it takes."""

    op: str
    data: list
    base: CatalogState | None
    base_ids: IdMap
    rows: RowUpdate
    state: CatalogState | None
    generative: list[int]


@dataclass
class CatalogChange:
    """The result of one update: the new service catalog version, and for each catalog that
    changed (``"generative"``, ``"ranker"``) the item ids (the table's) it took."""

    version: int
    catalogs: dict[str, list[str]] = field(default_factory=dict)


def next_generative(op: str, data: list, catalog: CatalogState | None, ranker: bool
                    ) -> tuple[CatalogState | None, list[int]]:
    """The next generative state of an update (``data`` in rows; ``None``: the state does
    not change; validated, not installed) and the rows it takes. A retire takes the rows the
    catalog has when there is a ``ranker`` (which takes every row), else every row (each must
    be known: :meth:`CatalogState.updated` names unknown ones)."""
    if op == "upsert":
        sids, _ = split_items(data)
        mine = [i for i, sid in sids if sid is not None]
        return (catalog.updated(sids) if mine else None), mine
    if not ranker:
        if catalog is None:
            raise ValueError("item_ids: no catalog to retire items from")
        mine = data
    else:
        n = catalog.num_items if catalog is not None else 0
        mine = [i for i in data if 0 <= i < n]
    return (catalog.updated(retire=mine) if mine else None), mine


def ranker_items(op: str, rows: list) -> list[dict[str, Any]] | None:
    """The ranker's items of an upsert (in rows); ``None`` for a retire."""
    return split_items(rows)[1] if op == "upsert" else None


def run_ranker(updater: CatalogUpdater | None, op: str, data: list,
               items: list[dict[str, Any]] | None, ids: IdMap) -> Any:
    """The ranker's part of an update (in rows of ``ids``, the id map after it): what its
    updater reports (``None``: no call)."""
    if op == "upsert" and items:
        return updater.upsert(items, ids=ids)
    if op == "retire" and updater is not None:
        return updater.retire(data, ids=ids)
    return None


def record_taken(change: CatalogChange, update: PreparedUpdate,
                 items: list[dict[str, Any]] | None, ranker: bool) -> CatalogChange:
    """``change`` with the table's ids each catalog took: the generative catalog's when its
    state changed, the ranker's (``items`` of an upsert; every id of a retire when there is
    a ``ranker``)."""
    names = update.rows.ids.ids_of
    if update.state is not None:
        change.catalogs[GENERATIVE] = names(update.generative)
    if update.op == "upsert" and items:
        change.catalogs[RANKER] = names(it["item_id"] for it in items)
    elif update.op == "retire" and ranker:
        change.catalogs[RANKER] = names(update.rows.data)
    return change
