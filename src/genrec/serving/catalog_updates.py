"""The ``/v1/catalog/items`` endpoint's logic, free of HTTP (:class:`CatalogUpdates`): an
upsert's items given their Semantic IDs where they have none, the update checked and built
beside the batches (:func:`prepare`), then queued to the engine's worker thread, which swaps
it in between batches."""

from __future__ import annotations

import asyncio
import itertools

from genrec.catalog.assign import IdAssigner, assign_upserts
from genrec.catalog.id_map import item_keys
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.update_plan import CatalogChange, PreparedUpdate
from genrec.serving.api_errors import ApiError
from genrec.serving.messages import CatalogOp, CatalogUpdate
from genrec.serving.scheduler import BatchScheduler
from genrec.serving.worker import BatchWorker


def prepare(catalog: ServiceCatalog, op: str, data: list) -> PreparedUpdate | CatalogOp:
    """The update built on the installed catalog (:meth:`ServiceCatalog.prepare`); following
    a shared log, an update refused there goes as it is, to be decided on the log's newest
    catalog (another replica's update may have made it valid)."""
    try:
        return catalog.prepare(op, data)
    except ValueError:
        if not catalog.follows:
            raise
        return CatalogOp(op, data)


class CatalogUpdates:
    """Catalog updates of ``worker``'s catalog, queued on ``scheduler`` one at a time, in
    order; ``assigner`` gives upserts without ``semantic_id`` theirs (default: from the
    codebooks saved with the engine's index, if any)."""

    def __init__(self, worker: BatchWorker, scheduler: BatchScheduler,
                 assigner: IdAssigner | None = None) -> None:
        catalog = worker.engine.catalog
        if assigner is None and catalog is not None:
            assigner = IdAssigner.of(catalog.base_vocab.index)
        self.worker, self.scheduler, self.assigner = worker, scheduler, assigner
        self._seq = itertools.count()
        self._updating = asyncio.Lock()  # updates prepared and queued one at a time, in order

    async def update(self, op: str, payload: list, deadline_ms: float | None) -> dict:
        """``op`` 'upsert' (item dicts) or 'retire' (item ids), all or nothing over the
        generative catalog and the ranker's (see :mod:`genrec.live_catalog.served`), run on the
        engine's worker thread between batches, so no batch sees a half-updated catalog.

        Upsert items with a ``semantic_id`` join the generative catalog; items without one, or
        with ranker fields (``text``, ``vectors``), go to the ranker. An item without
        ``semantic_id`` that gives ``embedding`` (or ``text`` the index's encoder embeds, see
        :func:`~genrec.catalog.assign.assign_upserts`) is given one by the index's codebooks,
        then upserted with it like any other: the answer's ``semantic_ids`` lists them. The
        answer's ``catalogs`` names which catalogs took which item ids.
        """
        catalog = self.worker.catalog
        if catalog is None:
            raise ApiError(400, "no catalog updater")
        if op not in ("upsert", "retire"):
            raise RuntimeError(f"unknown catalog operation {op!r}")
        data, assigned = list(payload), {}
        async with self._updating:  # IDs assigned against the catalog the update runs on
            if op == "upsert":
                data = [{k: v for k, v in it.items()
                         if k not in ("semantic_id", "embedding") or v is not None}
                        for it in payload]
                data, assigned = await asyncio.to_thread(self._assigned, catalog, data)
                try:
                    catalog.check(data)
                    catalog.split(data)
                except LookupError as err:
                    raise ApiError(400, str(err)) from None
            # built beside the batches: the worker only swaps it in
            prepared = await asyncio.to_thread(prepare, catalog, op, data)
            change: CatalogChange = await self.scheduler.submit(
                CatalogUpdate(next(self._seq)), prepared, deadline_ms)
        return {"catalog_version": change.version, "count": len(payload),
                "catalogs": change.catalogs, "semantic_ids": assigned or None}

    def _assigned(self, catalog: ServiceCatalog, items: list[dict]
                  ) -> tuple[list[dict], dict[str, list[int]]]:
        # upsert items with the Semantic IDs the index's codebooks give (assign_upserts)
        state = self.worker.engine.catalog
        if state is None:
            for k, item in enumerate(items):
                if "embedding" in item:
                    raise ValueError(f"items[{k}].embedding: this model has no Semantic-ID "
                                     f"vocabulary (not a generative model)")
            return items, {}
        rows = self.worker.ids.find(item_keys([it["item_id"] for it in items], "items")).tolist()
        return assign_upserts(items, self.assigner, state.lookup, rows,
                              ranker=catalog.ranker_updater is not None)
