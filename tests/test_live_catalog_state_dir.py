"""A catalog's state directory: opening it replays the logged updates (all but the last as one
net change, the last alone; an existing directory's version wins), a ranker's refusal of the
last record (never acknowledged) cuts it off, a record that cannot be replayed is refused
and lets the directory go, a second writer is refused while the first has it open. Over a
service catalog: it reopens over fresh catalogs the same (version, codes, retired items,
answers, the ranker's table), across folds too and with a compaction landing during the
replay; a read-only follower takes its updates' versions from the log."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from logged_catalog_support import assert_same, free_sids, ranker_pair, reopened, stream
from serving_support import N_ITEMS, tiny_engine

from genrec.catalog.id_map import IdMap
from genrec.live_catalog import served as service_catalog
from genrec.live_catalog.log import CatalogLog, FoldPolicy
from genrec.live_catalog.log_format import CatalogLogError, LogRecord
from genrec.live_catalog.served import ServiceCatalog
from genrec.live_catalog.state import CatalogState
from genrec.live_catalog.state_dir import open_dir
from genrec.live_catalog.stored import read_state


class Recorder:
    """A catalog a state directory is replayed onto, recording each call; ``refuse``: what
    its ranker refuses (``ValueError`` on install), ``unknown``: an item it cannot take at
    all (``LookupError`` on check), ``unplanned``: a version it cannot plan (a
    ``ValueError``)."""

    def __init__(self, after: int, refuse: int | None = None, unknown: int | None = None,
                 unplanned: int | None = None) -> None:
        self.after, self.refuse, self.unknown = after, refuse, unknown
        self.unplanned = unplanned
        self.lock, self.calls = threading.Lock(), []
        self.log: CatalogLog | None = None

    def check(self, items: list[dict[str, Any]]) -> None:
        self.calls.append(("check", [it["item_id"] for it in items]))
        if any(it["item_id"] == self.unknown for it in items):
            raise LookupError(f"items: item {self.unknown} unknown here")

    def install_base(self, base: Any) -> None:
        self.calls.append(("base", base.version))

    def install_records(self, records: Any, where: str) -> None:
        assert self.lock.locked()
        self.calls.append(("records", [r.version for r in records]))

    def plan_logged(self, record: LogRecord) -> tuple[Any, Any]:
        assert self.lock.locked()
        if record.version == self.unplanned:
            raise ValueError(f"version {record.version}: cannot be planned here")
        return record.data, None

    def install_planned(self, record: LogRecord, rows: Any, state: Any) -> None:
        if record.version == self.refuse:
            raise ValueError("vectors: refused")
        self.calls.append(("last", record.version))

    def attach(self, log: CatalogLog | None, follower: Any = None) -> None:
        self.log = log
        self.calls.append(("attach", None if log is None else log.version, follower))


def logged(path: Path, n: int, start: int = 0) -> Path:
    """A state directory with ``n`` updates after ``start``: upserts of item v, retires of
    item v - 1 every third version."""
    log, _ = CatalogLog.open(path, start)
    for v in range(start + 1, start + n + 1):
        log.append(LogRecord(v, "retire", [v - 1]) if v % 3 == 0 else
                   LogRecord(v, "upsert", [{"item_id": v}]))
    log.close()
    return path


def test_a_new_directory_starts_at_the_version_given(tmp_path: Path) -> None:
    catalog = open_dir(Recorder, tmp_path / "state", version=7)
    assert catalog.after == 7 and catalog.calls == [("attach", 7, None)]
    catalog.log.close()
    assert read_state(tmp_path / "state").version == 7


def test_opening_replays_the_head_as_one_change_then_the_last(tmp_path: Path) -> None:
    state = logged(tmp_path / "state", 5, start=2)  # versions 3..7
    catalog = open_dir(Recorder, state, version=99)  # an existing directory's version wins
    assert catalog.after == 2
    assert catalog.calls == [("check", [4]), ("check", [5]), ("check", [7]),
                             ("records", [3, 4, 5, 6]), ("last", 7), ("attach", 7, None)]
    with pytest.raises(CatalogLogError, match="in use by another process"):
        open_dir(Recorder, state)  # a second writer
    mirror = open_dir(Recorder, state, writable=False)  # replays, writes nothing
    assert mirror.calls[-2:] == [("last", 7), ("attach", None, None)]
    catalog.log.close()
    open_dir(Recorder, state).log.close()  # let go: writable again


def test_a_refused_last_record_is_cut_off(tmp_path: Path, caplog) -> None:
    state = logged(tmp_path / "state", 4)
    catalog = open_dir(lambda after: Recorder(after, refuse=4), state)
    assert catalog.calls[-2:] == [("records", [1, 2, 3]), ("attach", 3, None)]
    assert "(version 4), refused on replay" in caplog.text
    catalog.log.close()
    assert [r.version for r in read_state(state).records] == [1, 2, 3]


@pytest.mark.parametrize("refusal,why", [
    ({"unknown": 2}, "items: item 2 unknown here"),  # in the head
    ({"unknown": 4}, "items: item 4 unknown here"),  # the last, checked first
    ({"unplanned": 4}, "version 4: cannot be planned here")])  # the last, planned alone
def test_a_record_that_cannot_be_replayed_is_refused(tmp_path: Path, refusal: dict,
                                                     why: str) -> None:
    state = logged(tmp_path / "state", 4)
    with pytest.raises(CatalogLogError, match=rf"versions 1\.\.4 cannot be replayed here: "
                       rf"{why}"):
        open_dir(lambda after: Recorder(after, **refusal), state)
    catalog = open_dir(Recorder, state)  # the refused opening let the directory go
    assert catalog.calls[-1] == ("attach", 4, None)  # nothing cut off
    catalog.log.close()


# -- a service catalog kept in a state directory --------------------------------------------

def test_a_logged_catalog_reopens_the_same(tmp_path: Path) -> None:
    first = reopened(tmp_path / "state", version=3, compact_threshold=4,
                     fold=FoldPolicy(records=0, bytes=0))
    catalog = first[0]
    assert catalog.catalog_version == 3
    refused = stream(catalog, 30, seed=1)
    assert refused and catalog.catalog_version == 3 + 30 - refused
    assert catalog.compactor.wait(10) and catalog.compactor.completed
    catalog.close()
    again = reopened(tmp_path / "state", version=99)  # an existing directory's version wins
    assert_same(first, again)
    stream(again[0], 5, seed=2)  # goes on from there
    again[0].close()
    assert reopened(tmp_path / "state")[0].catalog_version == again[0].catalog_version


def test_a_fold_changes_nothing_on_reopening(tmp_path: Path) -> None:
    first = reopened(tmp_path / "state", fold=FoldPolicy(records=6, bytes=0))
    catalog = first[0]
    for seed in range(4):
        stream(catalog, 10, seed)
        assert catalog.folder.wait(10)
    version = catalog.catalog_version
    assert catalog.folder.completed >= 3 and version > 20
    stored = read_state(tmp_path / "state")
    assert stored.base is not None and stored.version == version
    assert len(stored.records) < 6 and stored.base.generative.codes.dtype == torch.int16
    ranker, updater = ranker_pair()  # a mirror: replays, writes nothing (the writer is open)
    mirror = ServiceCatalog.from_dir(tiny_engine(), updater, tmp_path / "state", writable=False)
    assert mirror.log is None
    assert_same(first, (mirror, ranker))
    catalog.close()
    assert_same(first, reopened(tmp_path / "state"))


class CompactionFirst:
    """A catalog lock before whose every acquisition (but a compaction's own) the compaction
    started earlier runs and is installed: the latest a compaction can land, right before an
    update installs. Compactions wait for that (:meth:`CatalogState.compacted` held)."""

    go = threading.Event()

    def __init__(self) -> None:
        self.lock = threading.Lock()

    @classmethod
    def hold_compactions(cls, monkeypatch: pytest.MonkeyPatch) -> None:
        compacted = CatalogState.compacted

        def held(state: CatalogState, device: str | None = None) -> CatalogState:
            assert cls.go.wait(10)
            return compacted(state, device)

        monkeypatch.setattr(CatalogState, "compacted", held)
        monkeypatch.setattr(service_catalog, "threading", SimpleNamespace(Lock=cls))

    def __enter__(self) -> None:
        me = threading.current_thread()
        if me.name != "genrec-compaction":
            self.go.set()
            for thread in threading.enumerate():
                if thread.name == "genrec-compaction" and thread is not me:
                    thread.join(10)
            self.go.clear()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


@pytest.mark.parametrize("last", ["retire", "upsert"])
def test_a_compaction_during_the_replay_changes_nothing(tmp_path: Path, monkeypatch, caplog,
                                                          last: str) -> None:
    # the replay's head makes a compaction due; it lands before the last record installs:
    # that record (in rows) is installed as logged, its new item keeping its id
    names = IdMap.build([f"song-{i}" for i in range(N_ITEMS)])
    writer = ServiceCatalog.from_dir(tiny_engine(), None, tmp_path / "state",
                                     compact_threshold=0, ids=names)
    sids = free_sids(writer.engine, 6)
    for k in range(4):
        writer.upsert([{"item_id": f"new-{k}", "semantic_id": sids[k]}])
    if last == "retire":
        writer.retire(["song-3", "new-1"])
    else:
        writer.upsert([{"item_id": "new-4", "semantic_id": sids[4]},
                       {"item_id": "song-5", "semantic_id": sids[5]}])
    writer.close()
    CompactionFirst.hold_compactions(monkeypatch)
    again = ServiceCatalog.from_dir(tiny_engine(), None, tmp_path / "state",
                                    compact_threshold=2, ids=names)
    CompactionFirst.go.set()  # a compaction the last record started, too
    assert again.compactor.wait(10) and again.compactor.completed  # they did land
    assert "refused on replay" not in caplog.text
    assert again.catalog_version == writer.catalog_version
    n = writer.engine.catalog.num_items
    assert again.engine.catalog.num_items == n and len(again.ids) == n
    assert again.ids.ids_of(range(n)) == writer.ids.ids_of(range(n))
    assert torch.equal(again.engine.catalog.codes_of(torch.arange(n)),
                       writer.engine.catalog.codes_of(torch.arange(n)))
    assert again.engine.catalog.retired() == writer.engine.catalog.retired()
    again.close()


def test_a_refused_record_at_the_tail_is_dropped_on_replay(tmp_path: Path, caplog) -> None:
    catalog, _ = reopened(tmp_path / "state")
    stream(catalog, 6, seed=3)
    version, log = catalog.catalog_version, catalog.log
    bad = [{"item_id": 1, "vectors": [[0.0]]}]  # the ranker refuses it
    log.append(LogRecord(version + 1, "upsert", bad))  # the process died before cutting it
    catalog.close()
    again, _ = reopened(tmp_path / "state")
    assert again.catalog_version == version and "refused on replay" in caplog.text
    assert read_state(tmp_path / "state").version == version  # cut off there
    again.log.append(LogRecord(version + 1, "upsert", bad))
    again.log.append(LogRecord(version + 2, "retire", [3]))
    again.close()
    with pytest.raises(CatalogLogError, match=rf"versions 1..{version + 2} cannot be replayed "
                       r"here: items\[1\]: expected \[2, 32\] vectors"):
        reopened(tmp_path / "state")
    with pytest.raises(CatalogLogError, match="no ranker catalog to update"):
        ServiceCatalog.from_dir(tiny_engine(), None, tmp_path / "state")



def test_a_read_only_follower_takes_versions_from_the_log(tmp_path: Path) -> None:
    state = tmp_path / "state"
    writer = ServiceCatalog.from_dir(tiny_engine(), None, state, follow=True)
    mirror = ServiceCatalog.from_dir(tiny_engine(), None, state, writable=False, follow=True)
    other = ServiceCatalog.from_dir(tiny_engine(), None, state, follow=True)
    other.retire([5])  # logged elsewhere, not yet seen by the mirror
    writer.retire([6])
    assert mirror.retire([6]).version == 2 and mirror.catalog_version == 2
    assert set(mirror.engine.catalog.retired()) == {5, 6}
    for catalog in (writer, other):
        catalog.close()


