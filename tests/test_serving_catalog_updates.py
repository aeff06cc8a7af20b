"""Catalog updates without HTTP: an upsert and a retire installed in order under the next
versions, the answer naming the version and the catalogs; a refused update changes
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from logged_catalog_support import free_sids
from serving_support import N_ITEMS, tiny_engine

from genrec.engine import Engine
from genrec.serving.catalog_updates import CatalogUpdates, prepare
from genrec.serving.scheduler import BatchScheduler
from genrec.serving.worker import Worker


@pytest.fixture
def served() -> Iterator[tuple[Engine, Worker, CatalogUpdates]]:
    engine = tiny_engine()
    worker = Worker(engine)
    scheduler = BatchScheduler(worker.run, max_wait_ms=1)
    yield engine, worker, CatalogUpdates(worker, scheduler)
    scheduler.close(10)
    worker.close()


def test_updates_install_in_order_under_the_next_versions(
        served: tuple[Engine, Worker, CatalogUpdates]) -> None:
    engine, worker, updates = served
    [sid] = free_sids(engine, 1)
    start = worker.catalog_version

    async def both() -> tuple[dict, dict]:
        return await asyncio.gather(
            updates.update("upsert", [{"item_id": N_ITEMS, "semantic_id": sid}], None),
            updates.update("retire", [N_ITEMS], None))

    upserted, retired = asyncio.run(both())
    assert (upserted["catalog_version"], retired["catalog_version"]) == (start + 1, start + 2)
    assert upserted["count"] == retired["count"] == 1 and upserted["semantic_ids"] is None
    assert upserted["catalogs"]["generative"] == [str(N_ITEMS)]
    assert worker.catalog_version == engine.catalog.version == start + 2


def test_a_refused_update_changes_nothing(served: tuple[Engine, Worker, CatalogUpdates]
                                          ) -> None:
    engine, worker, updates = served
    start, state = worker.catalog_version, engine.catalog
    with pytest.raises(ValueError, match=r"item_ids: unknown item ids \['45'\]"):
        asyncio.run(updates.update("retire", [N_ITEMS + 5], None))
    with pytest.raises(ValueError, match=r"item_ids: unknown item ids \['45'\]"):
        prepare(worker.catalog, "retire", [N_ITEMS + 5])  # not following a log: refused here
    with pytest.raises(RuntimeError, match="unknown catalog operation 'replace'"):
        asyncio.run(updates.update("replace", [], None))
    assert worker.catalog_version == start and engine.catalog is state
