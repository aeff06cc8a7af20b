"""The engine's public requests in the catalog's own ids, translated to rows and back.

:meth:`genrec.engine.Engine.recommend` takes :class:`RecommendRequest` (items named by the
table's ids, as the HTTP API names them) and searches :class:`RowRequest` (rows ``0 .. N-1``);
unknown ``history`` and ``exclude`` ids are left out and reported (``ignored``), an unknown
``allow`` id is an error naming the field and the id (:class:`genrec.catalog.id_map.IdMap`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from genrec.catalog.id_map import IdMap
from genrec.engine.inputs import InputError
from genrec.engine.requests import Recommendation, RecommendRequest, RowRecommendation, RowRequest
from genrec.live_catalog.state import CatalogState


def catalog_ids(catalog: CatalogState) -> IdMap:
    """The ids of a catalog state's rows: its Semantic-ID index's ``item_ids`` (rows added
    after it named by their numbers, as :attr:`CatalogState.vocab` names them), else
    ``"0" .. "N-1"``. O(N): built once per installed catalog, on first use."""
    names = catalog.base_vocab.index.item_ids
    n = catalog.num_items
    if names is None:
        return IdMap.rows_named(n)
    return IdMap.build([*names[:n], *(str(i) for i in range(len(names), n))])


class ServedCatalog:
    """A catalog state and the ids of its rows (given, or :func:`catalog_ids` on first use):
    what an engine installs and reads in one swap."""

    def __init__(self, state: CatalogState, ids: IdMap | None = None) -> None:
        if ids is not None and len(ids) != state.num_items:
            raise ValueError(f"ids: {len(ids)} ids for a catalog of {state.num_items} items")
        self.state = state
        if ids is not None:
            self.ids = ids

    @functools.cached_property
    def ids(self) -> IdMap:
        """The table's ids of the state's rows."""
        return catalog_ids(self.state)


def to_rows(requests: Sequence[RecommendRequest], ids: IdMap
            ) -> tuple[list[RowRequest], list[list[str]]]:
    """Each request in rows, and the ids it names that ``ids`` lacks (``history`` then
    ``exclude``; left out). Raises ``InputError`` naming the field: a bad id, an unknown
    ``allow`` id, or a history none of whose items is known with nothing else to
    recommend from."""
    rows, ignored = [], []
    for r, req in enumerate(requests):
        field = f"requests[{r}]"
        if isinstance(req.history, (str, bytes)):
            raise InputError(f"{field}.history: expected a list of item ids")
        try:
            history, unknown = ids.known(list(req.history), f"{field}.history")
            exclude, skipped = (ids.known(list(req.exclude), f"{field}.exclude")
                                if req.exclude is not None else (None, []))
            allow = (ids.rows(list(req.allow), f"{field}.allow") if req.allow is not None
                     else None)
        except ValueError as err:
            raise InputError(str(err)) from None
        if req.history and not history and req.user_vector is None and not req.text:
            raise InputError(f"{field}.history: none of its {len(req.history)} items is in "
                             f"the catalog ({unknown[:10]}), and there is no user_vector: "
                             f"nothing to recommend from")
        rows.append(RowRequest(history, req.user_vector, exclude, allow, req.text))
        ignored.append(unknown + skipped)
    return rows, ignored


def to_ids(found: Sequence[RowRecommendation], ids: IdMap, ignored: Sequence[list[str]]
           ) -> list[Recommendation]:
    """The row results named by ``ids``, with each request's ``ignored`` ids."""
    return [Recommendation(ids.ids_of(rec.items), rec.scores, skipped)
            for rec, skipped in zip(found, ignored, strict=True)]
