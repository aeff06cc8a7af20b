"""What an update's items ask of the served catalog, checked before any state is built:
which item goes where (the generative catalog takes a ``semantic_id``, the ranker every other
field), duplicate ids, and what this server cannot do at all."""

from __future__ import annotations

from typing import Any

from genrec.live_catalog.base import ranker_part

SemanticIds = list[tuple[int, list[int] | None]]


def split_items(items: list[dict[str, Any]]) -> tuple[SemanticIds, list[dict[str, Any]]]:
    """``(item id, Semantic ID or None)`` per upsert item, and the items for the ranker
    (without ``semantic_id``). Raises ``ValueError`` naming the field for duplicate ids."""
    seen: dict[int, int] = {}
    for k, item in enumerate(items):
        i = item["item_id"]
        if i in seen:
            raise ValueError(f"items[{k}].item_id: item {i} is given twice (also "
                             f"items[{seen[i]}])")
        seen[i] = k
    sids = [(it["item_id"], it.get("semantic_id")) for it in items]
    ranker = [part for part in map(ranker_part, items) if part is not None]
    return sids, ranker


def check_items(items: list[dict[str, Any]], generative: bool, ranker: bool) -> None:
    """What a server with (``generative``) or without a generative catalog and with
    (``ranker``) or without a ranker updater cannot do at all; raises ``LookupError`` naming
    the field."""
    for k, item in enumerate(items):
        if item.get("semantic_id") is not None and not generative:
            raise LookupError(f"items[{k}].semantic_id: this model has no Semantic-ID "
                              f"vocabulary (not a generative model)")
        if not ranker and ranker_part(item) is not None:
            raise LookupError(f"items[{k}]: no ranker catalog to update (the server has no "
                              f"catalog updater); an item of the generative catalog takes "
                              f"only 'item_id' and 'semantic_id'")
