"""Shared by the tests of a service catalog kept in a state directory: a DuoLM ranker's live
table with its updater, a random stream of catalog updates (refused ones among them), and
the comparison of two service catalogs. (Not a test module.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from serving_support import N_ITEMS, SIZES, tiny_engine

from genrec import BeamParams, Engine
from genrec.catalog.item_table import ItemTable
from genrec.duolm.ranker import DuoRanker
from genrec.engine import RowRequest
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.stored import read_state
from genrec.serving.backends import RankerCatalogUpdater


def free_sids(engine: Engine, n: int) -> list[list[int]]:
    """The first ``n`` Semantic IDs no item of ``engine``'s catalog has."""
    used = {tuple(c) for c in engine.vocab.index.codes.tolist()}
    every = torch.cartesian_prod(*[torch.arange(k) for k in SIZES]).tolist()
    return [c for c in every if tuple(c) not in used][:n]


def ranker_pair(seed: int = 0) -> tuple[DuoRanker, RankerCatalogUpdater]:
    """A DuoLM student's live item table (2 vectors of 32 per item) and its updater."""
    g = torch.Generator().manual_seed(seed)
    ranker = DuoRanker(tiny_engine(), ItemTable(torch.randn(N_ITEMS, 2, 32, generator=g)))
    return ranker, RankerCatalogUpdater(ranker)


def stream(catalog: ServiceCatalog, rounds: int, seed: int) -> int:
    """Random upserts (new items to both catalogs or to the generative one only, moved
    Semantic IDs, ranker vectors, also of items the ranker did not have) and retires, with
    refused ones between (a taken Semantic ID, vectors of the wrong shape):
    how many were refused. Each refused update leaves no record and changes nothing."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda n: int(torch.randint(0, n, (1,), generator=g))  # noqa: E731
    vectors = lambda: torch.randn(2, 32, generator=g).tolist()  # noqa: E731
    refused = 0
    for _ in range(rounds):
        state = catalog.engine.catalog
        n, kind = state.num_items, pick(6)
        sids = free_sids(catalog.engine, 2 + pick(20))[-2:]
        if len(sids) < 2:  # every Semantic ID taken
            kind = 1
        if kind == 0:
            batch = [{"item_id": n, "semantic_id": sids[0], "vectors": vectors()},
                     {"item_id": pick(n), "semantic_id": sids[1]}]
        elif kind == 1:
            batch = [{"item_id": pick(n), "vectors": vectors()}]
        elif kind == 5:  # the ranker's table falls behind the id map: it grows on its next call
            batch = [{"item_id": n, "semantic_id": sids[0]}]
        elif kind == 2:
            catalog.retire(sorted({pick(n), pick(n)}))
            continue
        else:  # refused: another item's ID, or vectors the ranker cannot take
            batch = ([{"item_id": 0, "semantic_id": state.codes_of([1])[0].tolist()}]
                     if kind == 3 else [{"item_id": n, "semantic_id": sids[0],
                                         "vectors": [[0.0] * 3]}])
            version = catalog.catalog_version
            with pytest.raises(ValueError):
                catalog.upsert(batch)
            after = catalog.engine.catalog  # maybe compacted meanwhile: the same catalog
            assert catalog.catalog_version == version
            assert torch.equal(after.codes_of(torch.arange(after.num_items)),
                               state.codes_of(torch.arange(n)))
            assert read_state(catalog.log.path.parent).version == version
            refused += 1
            continue
        catalog.upsert(batch)
    return refused


def reopened(path: Path, **kw) -> tuple[ServiceCatalog, DuoRanker]:
    """A service catalog from the state directory ``path`` over fresh catalogs (engine and
    ranker as loaded)."""
    ranker, updater = ranker_pair()
    return ServiceCatalog.from_dir(tiny_engine(), updater, path, **kw), ranker


def assert_same(a: tuple[ServiceCatalog, DuoRanker], b: tuple[ServiceCatalog, DuoRanker]
                ) -> None:
    """The same version, item codes, retired items, answers and ranker table."""
    (one, r1), (two, r2) = a, b
    s1, s2 = one.engine.catalog, two.engine.catalog
    assert one.catalog_version == two.catalog_version
    assert s1.num_items == s2.num_items and s1.retired() == s2.retired()
    n = s1.num_items
    assert torch.equal(s1.codes_of(torch.arange(n)), s2.codes_of(torch.arange(n)))
    requests = [RowRequest([3, 17, 8]), RowRequest([5, n - 1], exclude=[0, 1, 2]),
                RowRequest([20], allow=[4, 9, *range(n - 10, n)])]  # new, some retired
    recs = [c.engine.recommend_rows(requests, BeamParams(12, 12)) for c in (one, two)]
    assert [r.items for r in recs[0]] == [r.items for r in recs[1]]
    for x, y in zip(*recs, strict=True):
        assert x.scores == pytest.approx(y.scores, abs=1e-4)
    assert torch.equal(r1.table.vectors, r2.table.vectors)
    assert torch.equal(r1.table.active, r2.table.active)
