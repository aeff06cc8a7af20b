"""The served catalog's item ids: the table's ids of the model (its Semantic-ID index, else
the ranker's item store, else the rows' own numbers), and a catalog update translated from
those ids to rows, an unseen id of an upsert becoming the next row.

Every update is logged in rows together with the ids it added (:class:`RowUpdate`), so the
id map is replayed, followed and folded into bases with the rest of the catalog state: never
ahead of it or behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from genrec.catalog.id_map import IdMap, item_key

if TYPE_CHECKING:
    from genrec.live_catalog.host import CatalogHost


@dataclass(frozen=True)
class RowUpdate:
    """An update in rows: ``data`` (upsert: the item dicts with ``item_id`` a row; retire:
    rows), the ids it adds (``added``, rows ``len(before)``, ... in order) and the map after
    it (``ids``)."""

    data: list
    added: tuple[str, ...]
    ids: IdMap


def model_ids(engine: CatalogHost, ranker: Any = None) -> IdMap:
    """The ids of the catalog a server loads: its generative catalog's (the Semantic-ID
    index's ``item_ids``), else the ranker's (its ``item_ids``), else ``"0" .. "N-1"``."""
    state = engine.catalog
    if state is not None:
        index = state.base_vocab.index
        if index.item_ids is not None:
            return IdMap.build(index.item_ids)
        return IdMap.rows_named(state.num_items)
    names = getattr(ranker, "item_ids", None)
    if names is not None:
        return IdMap.build(names)
    table = engine.item_table
    return IdMap.rows_named(table.num_items if table is not None else 0)


def to_rows(ids: IdMap, op: str, data: list, generative: bool) -> RowUpdate:
    """``op`` ``"upsert"`` (item dicts) or ``"retire"`` (ids) of the table's ids in rows.
    An upsert's unseen ids are added (in order; with a ``generative`` catalog each needs its
    ``semantic_id``); a retire's must all be known. Raises ``ValueError`` naming the field and
    the ids."""
    if op == "retire":
        return RowUpdate(ids.rows(data, "item_ids"), (), ids)
    keys = [item_key(item.get("item_id"), f"items[{k}].item_id") for k, item in enumerate(data)]
    first: dict[str, int] = {}
    for k, key in enumerate(keys):
        if first.setdefault(key, k) != k:
            raise ValueError(f"items[{k}].item_id: item {key!r} is given twice (also "
                             f"items[{first[key]}])")
    found = ids.find(keys)
    new = np.flatnonzero(found < 0)
    if generative:
        for k in new.tolist():
            if data[k].get("semantic_id") is None:
                raise ValueError(f"items[{k}].semantic_id: item {keys[k]!r} is new: the "
                                 f"generative catalog takes a new item with its semantic_id")
    found[new] = len(ids) + np.arange(new.size)
    rows = [{**item, "item_id": row} for item, row in zip(data, found.tolist(), strict=True)]
    added = tuple(keys[k] for k in new.tolist())
    return RowUpdate(rows, added, ids.extended(added))


def logged_rows(ids: IdMap, data: list, added: tuple[str, ...] | list[str]) -> RowUpdate:
    """A logged update (``data`` in rows, the ``added`` ids) onto the map ``ids`` it was
    logged after. Raises ``ValueError`` when an added id is already there."""
    known = ids.find(list(added))
    if (known >= 0).any():
        raise ValueError(f"ids: {added[int(np.argmax(known >= 0))]!r} is added again")
    return RowUpdate(data, tuple(added), ids.extended(list(added)))
