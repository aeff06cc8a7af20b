"""The served catalog: the generative engine's catalog and the ranker's item table, updated
together, all or nothing, under one version number.

Which catalog an update goes to: :mod:`genrec.live_catalog.update_plan`.

All or nothing: the new generative state is validated and built first (nothing installed),
then the ranker updater runs (it validates everything before its own one swap), and only then
is the generative state installed, by one reference assignment that cannot fail. If either
step raises, neither catalog changes. Updates run on the engine's worker thread between
batches (see :func:`genrec.serving.backends.make_runner`), so no batch sees one catalog
updated and not the other. The generative state can be built before, off that thread
(:meth:`ServiceCatalog.prepare`, concurrently with the batches): the worker then only swaps
it in, unless another state was installed meanwhile (then it is rebuilt there).

The generative catalog is a base plus a delta of the changes since its last compaction
(:mod:`genrec.live_catalog.state`); once the delta is large enough, an update starts a
background compaction (:mod:`genrec.live_catalog.compaction`), installed under the same lock
without changing the version.

Durably (:meth:`ServiceCatalog.from_dir`, :mod:`genrec.live_catalog.state_dir`), an update's
record is appended and fsynced before the ranker's updater runs and the state is installed;
several processes can serve one state directory, each applying what the others log
(:meth:`ServiceCatalog.catch_up`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genrec.catalog.id_map import IdMap
from genrec.live_catalog.base import CatalogBase, install_base, install_updates, ranker_part
from genrec.live_catalog.compaction import CatalogStats, Compactor, LogFolder
from genrec.live_catalog.ids import RowUpdate, logged_rows, model_ids, to_rows
from genrec.live_catalog.items import SemanticIds, check_items, split_items
from genrec.live_catalog.log import CatalogLog, FoldPolicy
from genrec.live_catalog.log_format import CatalogLogError, LogRecord
from genrec.live_catalog.state_dir import mirrored_version, open_dir, shared_write
from genrec.live_catalog.update_plan import (
    CatalogChange,
    PreparedUpdate,
    next_generative,
    ranker_items,
    record_taken,
    run_ranker,
)

if TYPE_CHECKING:
    from genrec.live_catalog.follow import LogFollower
    from genrec.live_catalog.host import CatalogHost, CatalogUpdater
    from genrec.live_catalog.state import CatalogState


class ServiceCatalog:
    """One version number over the engine's generative catalog and an optional ranker
    catalog updater. ``catalog_version`` starts at ``version`` and grows by one per update
    (without a log, never falling behind the version the ranker's updater reports: with a
    DuoLM ranker it equals the ranker table's version as long as every update touches it).

    ``compact_threshold``: delta items of the generative catalog that start a background
    compaction (``None``: :func:`~genrec.live_catalog.compaction.compaction_threshold` of the
    catalog size; 0: never compact). ``log``: the durable log every update is appended to
    (its version must be ``version``; ``None``: updates live in memory only; see
    :meth:`from_dir`). ``ids``: the table's ids of the catalogs as loaded (default
    :func:`~genrec.live_catalog.ids.model_ids` of the engine); :attr:`ids` is the map of
    the catalog served, installed with each update's state."""

    def __init__(self, engine: CatalogHost, ranker_updater: CatalogUpdater | None = None,
                 version: int = 0, compact_threshold: int | None = None,
                 log: CatalogLog | None = None, ids: IdMap | None = None,
                 pinned: bool = False) -> None:
        self.engine, self.ranker_updater = engine, ranker_updater
        self.loaded_ids = ids if ids is not None else model_ids(engine)
        self.ids = self.loaded_ids  # the served catalog's: swapped with its state, under _lock
        self._version = int(version)
        self.lock = threading.Lock()  # serialises updates (and installs); readers never wait
        self.compactor = Compactor(engine, self.lock, compact_threshold)
        # versions one by one, the ranker's reports ignored (a logged catalog's)
        self._pinned = pinned or log is not None
        self.log: CatalogLog | None = None
        self.folder: LogFolder | None = None
        self.follower: LogFollower | None = None  # following a shared directory (from_dir)
        if log is not None:
            self.attach(log)

    @classmethod
    def from_dir(cls, engine: CatalogHost, ranker_updater: CatalogUpdater | None,
                 state_dir: str | Path, version: int = 0, compact_threshold: int | None = None,
                 fold: FoldPolicy | None = None, writable: bool = True,
                 follow: bool = False, ids: IdMap | None = None) -> ServiceCatalog:
        """The catalog kept in ``state_dir`` (:func:`~genrec.live_catalog.state_dir.open_dir`):
        replayed onto the catalogs as ``engine`` and the ranker loaded them; later updates
        logged there. ``writable=False``: replay only, later updates in memory (a mirror of
        what another process logs); ``follow``: the directory is shared with other processes
        (its lock held for each write only), :meth:`catch_up` applies what they log (and, not
        ``writable``, the updates this process is given are taken from the log)."""
        return open_dir(lambda after: cls(engine, ranker_updater, after, compact_threshold,
                                          ids=ids, pinned=True),
                        state_dir, version, fold, writable, follow)

    def attach(self, log: CatalogLog | None, follower: LogFollower | None = None) -> None:
        """Append every later update to ``log`` (at this catalog's version; ``None``: none);
        ``follower``: apply what other processes log to a shared directory."""
        if follower is not None:
            self.follower = follower
        if log is None:
            return
        if log.version != self._version:
            raise ValueError(f"log: at version {log.version}, the catalog at {self._version}")
        self.log, self.folder = log, LogFolder(log)

    def install_records(self, records: Sequence[LogRecord], where: str) -> None:
        """Bring both catalogs and the id map forward by logged ``records`` (of ``where``) as
        one net change per catalog (a replay on start; under the lock)."""
        ids = self.ids
        for r in records:
            ids = logged_rows(ids, r.data, r.ids).ids
        install_updates([(r.op, r.data) for r in records], records[-1].version,
                        self.engine, self.ranker_updater, where, ids)
        self._version, self.ids = records[-1].version, ids
        self.compactor.maybe_start()

    @property
    def catalog_version(self) -> int:
        """The version being served."""
        return self._version

    def snapshot(self) -> tuple[int, Any]:
        """The version served and the engine's generative catalog state of that version,
        read together (a batch prepared on another thread reads both at once)."""
        with self.lock:
            return self._version, self.engine.catalog

    @property
    def generative(self) -> bool:
        """Whether the engine has a generative catalog to update."""
        return self.engine.catalog is not None

    @staticmethod
    def for_ranker(item: dict[str, Any]) -> bool:
        """Whether an upsert item goes to the ranker: it has no ``semantic_id`` or it has
        other fields (text, vectors...)."""
        return ranker_part(item) is not None

    def split(self, items: list[dict[str, Any]]) -> tuple[SemanticIds, list[dict[str, Any]]]:
        """:func:`~genrec.live_catalog.items.split_items`."""
        return split_items(items)

    def check(self, items: list[dict[str, Any]]) -> None:
        """What this server cannot do at all (``LookupError`` naming the field):
        :func:`~genrec.live_catalog.items.check_items`."""
        check_items(items, self.generative, self.ranker_updater is not None)

    def upsert(self, items: list[dict[str, Any]]) -> CatalogChange:
        """Add or replace items (see the module docstring); returns the change."""
        return self.apply(("upsert", items))

    def retire(self, item_ids: list[str | int]) -> CatalogChange:
        """Retire items from the generative catalog (the ids it has; every id when there is no
        ranker) and from the ranker (every id)."""
        return self.apply(("retire", list(item_ids)))

    def prepare(self, op: str, data: list) -> PreparedUpdate:
        """Validate an update (``op`` ``"upsert"``: item dicts, ``"retire"``: item ids) and
        build the next generative state from the installed one, installing nothing: on any
        thread, concurrently with the engine's batches, so that :meth:`apply` (between
        batches) only swaps it in. Raises ``ValueError`` naming the field (and the ids)."""
        data = list(data)
        self._checked(op, data)
        # off the engine's thread: its device work never overlaps a graph capture (the device
        # lock first, as compaction takes it before the catalog's)
        with self.engine.device_work():
            return self._prepared(op, data, self.ids)

    def _prepared(self, op: str, data: list, ids: IdMap, rows: RowUpdate | None = None
                  ) -> PreparedUpdate:
        # the update (``data`` in the table's ids) in rows of the id map ``ids`` (read once:
        # the map the rows are built on is the one recorded), and its next generative state,
        # built on the state installed now; ``rows``: the update already in rows of ``ids``
        base = self.engine.catalog
        if rows is None:
            rows = to_rows(ids, op, data, self.generative)
        state, mine = next_generative(op, rows.data, base, self.ranker_updater is not None)
        return PreparedUpdate(op, data, base, ids, rows, state, mine)

    def apply(self, update: PreparedUpdate | tuple[str, list]) -> CatalogChange:
        """Run an update (``(op, data)`` or :meth:`prepare`'s result) on both catalogs, all or
        nothing, under the next version. A prepared generative state is installed as built
        when the installed state is still the one it was built on (else it is rebuilt)."""
        if isinstance(update, PreparedUpdate):
            op, data = update.op, update.data
        else:
            op, data = update[0], list(update[1])
            self._checked(op, data)
        with self.lock, shared_write(self, self.log, self.follower):
            if self.follower is not None and self.log is None:  # logged by the writer
                rows = to_rows(self.ids, op, data, self.generative)
                return CatalogChange(mirrored_version(self, self.follower, op, rows.data))
            if not isinstance(update, PreparedUpdate) or update.base_ids is not self.ids:
                update = self._prepared(op, data, self.ids)  # rows of another map: again
            elif update.base is not self.engine.catalog:  # a compaction or an update since
                update = self._prepared(op, data, self.ids, update.rows)  # the same rows
            rows, state = update.rows, update.state
            items = ranker_items(op, rows.data)
            version = self._version + 1
            if self.log is not None:  # on disk before anything is installed
                self.log.append(LogRecord(version, op, rows.data, rows.added))
            try:
                reported = run_ranker(self.ranker_updater, op, rows.data, items, rows.ids)
            except BaseException:
                if self.log is not None:  # refused: no record of it stays
                    self.log.discard_last()
                raise
            change = self._commit(state, reported, version, rows.ids)
            if self.follower is not None:
                self.follower.tail.state = self.log.tail_state()
        return record_taken(change, update, items, self.ranker_updater is not None)

    @property
    def follows(self) -> bool:
        """Whether this catalog follows a state directory other processes write too."""
        return self.follower is not None

    def catch_up(self) -> int:
        """Apply what other processes logged since the last look (a follower, see
        :meth:`from_dir`; call it between batches); returns the version now served."""
        if self.follower is not None:
            with self.lock:
                self.follower.catch_up(self)
        return self._version

    def install_base(self, base: CatalogBase) -> None:
        """Replace both catalogs and the id map by a logged ``base`` (on start, or a follower
        behind a fold; under the lock)."""
        ids = self.loaded_ids.extended(list(base.ids))
        install_base(base, self.engine, self.ranker_updater, ids)
        state = self.engine.catalog
        if state is not None and state.num_items != len(ids):
            raise CatalogLogError(f"base-{base.version}.pt: {state.num_items} items and "
                                  f"{len(ids)} item ids")
        self.ids, self._version = ids, base.version

    def install_logged(self, record: LogRecord) -> None:
        """Apply an update another process logged, as its ``record`` says (a follower; under
        the lock). Raises ``ValueError`` when these catalogs refuse it."""
        self._checked(record.op, record.data)
        self.install_planned(record, *self.plan_logged(record))

    def plan_logged(self, record: LogRecord) -> tuple[RowUpdate, CatalogState | None]:
        """A logged update onto the installed id map and state (under the lock): its rows
        and the next generative state (``None``: unchanged); raises as the update's checks
        do."""
        rows = logged_rows(self.ids, record.data, record.ids)
        ranker = self.ranker_updater is not None
        return rows, next_generative(record.op, record.data, self.engine.catalog, ranker)[0]

    def install_planned(self, record: LogRecord, rows: RowUpdate,
                        state: CatalogState | None) -> None:
        """The ranker's part of a logged update, then both catalogs installed under its
        version (under the lock); ``ValueError``: the ranker's updater refused it, nothing
        installed."""
        items = ranker_items(record.op, record.data)
        reported = run_ranker(self.ranker_updater, record.op, record.data, items, rows.ids)
        self._commit(state, reported, record.version, rows.ids, fold=False)

    def _checked(self, op: str, data: list) -> None:
        # the input checks that need no catalog state
        if op not in ("upsert", "retire"):
            raise RuntimeError(f"unknown catalog operation {op!r}")
        if op == "upsert":
            try:
                self.check(data)
            except LookupError as err:  # bad input for this server
                raise ValueError(str(err)) from None

    def _commit(self, state: Any, reported: Any, version: int, ids: IdMap, fold: bool = True
                ) -> CatalogChange:
        """Install the generative ``state`` (if any) and the id map ``ids`` under ``version``
        (or the ranker's ``reported`` one, if later and versions are not pinned); under the
        lock, after every fallible step. ``fold``: a fold of the log may start (after an
        update logged here)."""
        if reported is not None and not self._pinned:
            reported = reported.version if isinstance(reported, CatalogChange) else reported
            version = max(version, int(reported))
        if state is not None:
            self.engine.set_catalog(state.with_version(version))  # the one swap readers see
            self.compactor.maybe_start()
        self.ids = ids  # after the state: a request's ids never name rows it lacks
        self._version = version
        if fold and self.folder is not None:  # the state and its ids, read together
            added = tuple(ids.ids_of(range(len(self.loaded_ids), len(ids))))
            self.folder.maybe_start(self.engine.catalog, added)
        return CatalogChange(version)

    def stats(self, drain: bool = True) -> CatalogStats:
        """The generative catalog's delta size and the compactions finished since the last
        call (``drain``: then forgotten)."""
        return self.compactor.stats(drain)

    def close(self, timeout_s: float = 1.0) -> None:
        """Start no more compactions or folds; wait up to ``timeout_s`` for running ones;
        close the log (a fold still running after that fails, logged: the log stays as it
        was before it)."""
        self.compactor.close(timeout_s)
        if self.folder is not None:
            self.folder.close(timeout_s)
            self.log.close()
