"""The served catalog: the generative engine's catalog and the ranker's item table, updated
together, all or nothing, under one version number.

An upsert item goes to

- the **generative catalog** (Semantic-ID index, trie, live items of the engine) when it has a
  ``semantic_id`` (one code per level); without one the generative model cannot produce it;
- the **ranker** (through its :class:`~genrec.serving.backends.CatalogUpdater`, e.g. item text
  encoded by the DuoLM item encoder) when it has any other field (``text``, ``vectors``...) or no
  ``semantic_id``.

A retire goes to the generative catalog (the ids it knows) and to the ranker (all ids).

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

Durability (:meth:`ServiceCatalog.from_dir`): an update is validated and its generative state
built, then its record appended and fsynced (:mod:`genrec.live_catalog.log`), then the
ranker's updater runs and the generative state is installed: what is acknowledged is on disk,
nothing is seen before. The ranker's updater validates as it runs: when it refuses, the record
is cut off again (no record of a refused update stays); should the process die in between (no
answer sent), the replay meets the same refusal (an updater's ``ValueError`` depends on its
input and table only) at the log's tail and drops the record. With a log each update takes
exactly the next version.

Several processes can serve one state directory (``from_dir(..., follow=True)``; see
:mod:`genrec.live_catalog.follow`): each applies what the others log
(:meth:`ServiceCatalog.catch_up`, between batches, on the path of a local update), and an
update holds the directory's lock from its catch-up to the log's end to its append, so the
log is the one order of everyone's updates and every version is the log's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genrec.catalog.id_map import IdMap
from genrec.live_catalog.base import CatalogBase, install_base, install_updates, ranker_part
from genrec.live_catalog.compaction import CatalogStats, Compactor, LogFolder
from genrec.live_catalog.follow import LogFollower, LogTail, StoredCatalog, read_followed
from genrec.live_catalog.ids import RowUpdate, logged_rows, model_ids, to_rows
from genrec.live_catalog.items import SemanticIds, check_items, split_items
from genrec.live_catalog.log import CatalogLog, FoldPolicy
from genrec.live_catalog.log_format import CatalogLogError, LogRecord

if TYPE_CHECKING:
    from genrec.live_catalog.host import CatalogHost, CatalogUpdater
    from genrec.live_catalog.state import CatalogState

GENERATIVE, RANKER = "generative", "ranker"

logger = logging.getLogger("genrec.serving")


@dataclass(frozen=True)
class PreparedUpdate:
    """An update checked and its next generative state built (:meth:`ServiceCatalog.prepare`)
    from ``base`` and ``base_ids``, the state and id map installed then: ``data`` as given
    (the table's ids), ``rows`` the same in rows; ``state`` is ``None`` when the generative
    catalog does not change, ``generative`` the rows it takes."""

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
                 log: CatalogLog | None = None, ids: IdMap | None = None) -> None:
        self.engine, self.ranker_updater = engine, ranker_updater
        self.loaded_ids = ids if ids is not None else model_ids(engine)
        self.ids = self.loaded_ids  # the served catalog's: swapped with its state, under _lock
        self._version = int(version)
        self._lock = threading.Lock()  # serialises updates (and installs); readers never wait
        self.compactor = Compactor(engine, self._lock, compact_threshold)
        self._pinned = log is not None  # versions one by one, the ranker's reports ignored
        self.log: CatalogLog | None = None
        self.folder: LogFolder | None = None
        self.follower: LogFollower | None = None  # following a shared directory (from_dir)
        if log is not None:
            self._attach(log)

    @classmethod
    def from_dir(cls, engine: CatalogHost, ranker_updater: CatalogUpdater | None,
                 state_dir: str | Path, version: int = 0, compact_threshold: int | None = None,
                 fold: FoldPolicy | None = None, writable: bool = True,
                 follow: bool = False, ids: IdMap | None = None) -> ServiceCatalog:
        """The catalog kept in ``state_dir``: its base and logged updates replayed onto the
        catalogs as ``engine`` and the ranker loaded them, the version restored; later updates
        are logged there. ``version``: where a new directory starts (an existing one's wins).
        ``fold``: log size that starts a background fold (default :class:`FoldPolicy`).
        ``writable=False``: replay only, later updates in memory (a mirror of what another
        process logs). ``follow``: the directory is shared with other processes (its lock
        held for each write only); :meth:`catch_up` applies what they log (and, not
        ``writable``, the updates this process is given are taken from the log). Raises
        ``CatalogLogError`` when it cannot be replayed here."""
        if writable:
            log, stored = CatalogLog.open(state_dir, version, fold or FoldPolicy(), follow)
            position = log.tail_state()
        else:
            log, (stored, position) = None, read_followed(state_dir, version)
        try:
            catalog = cls(engine, ranker_updater, stored.after, compact_threshold, ids=ids)
            catalog._pinned = True
            if stored.base is not None:
                catalog._install_base(stored.base)
            refused = catalog._replay(stored, Path(state_dir))
            if follow:
                catalog.follower = LogFollower(LogTail(state_dir, position))
                if refused:  # cut off by the next write, under the directory's lock
                    catalog.follower.tail.rewind()
            elif refused and log is not None:
                log.discard_last()
            if log is not None:
                catalog._attach(log)
        except BaseException:
            if log is not None:
                log.close()
            raise
        return catalog

    def _attach(self, log: CatalogLog) -> None:
        if log.version != self._version:
            raise ValueError(f"log: at version {log.version}, the catalog at {self._version}")
        self.log, self.folder = log, LogFolder(log)

    def _replay(self, stored: StoredCatalog, where: Path) -> bool:
        # all records but the last as one net change per catalog (a few calls however many
        # they are), then the last one alone: True when the ranker refused it (see above: it
        # is to be dropped). Each is installed from its rows under the lock, so a compaction
        # the head started cannot swap the state between reading it and installing onto it.
        head, last = stored.records[:-1], stored.records[-1:]
        span = f"versions {stored.after + 1}..{stored.version}"
        try:
            for record in stored.records:
                if record.op == "upsert":
                    self.check(record.data)
            if head:
                ids = self.ids
                for r in head:
                    ids = logged_rows(ids, r.data, r.ids).ids
                with self._lock:
                    install_updates([(r.op, r.data) for r in head], head[-1].version,
                                    self.engine, self.ranker_updater, str(where))
                    self._version, self.ids = head[-1].version, ids
                    self.compactor.maybe_start()
        except (LookupError, ValueError) as err:  # each was validated before it was logged
            raise CatalogLogError(f"{where}: {span} cannot be replayed here: {err}") from err
        for record in last:
            with self._lock:
                try:
                    rows, state = self._logged(record)
                except (LookupError, ValueError) as err:
                    raise CatalogLogError(f"{where}: {span} cannot be replayed here: "
                                          f"{err}") from err
                try:
                    self._install_logged(record, rows, state)
                except ValueError as err:  # the ranker's updater refused it: never acknowledged
                    logger.warning("%s: the last update (version %d), refused on replay, was "
                                   "never acknowledged: dropped (%s)", where, record.version,
                                   err)
                    return True
        return False

    @property
    def catalog_version(self) -> int:
        """The version being served."""
        return self._version

    def _install_base(self, base: CatalogBase) -> None:
        # both catalogs and the id map as of a logged base (under the lock, or before use)
        ids = self.loaded_ids.extended(list(base.ids))
        install_base(base, self.engine, self.ranker_updater)
        state = self.engine.catalog
        if state is not None and state.num_items != len(ids):
            raise CatalogLogError(f"base-{base.version}.pt: {state.num_items} items and "
                                  f"{len(ids)} item ids")
        self.ids = ids

    def snapshot(self) -> tuple[int, Any]:
        """The version served and the engine's generative catalog state of that version,
        read together (a batch prepared on another thread reads both at once)."""
        with self._lock:
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

    def check_input(self, items: list[dict[str, Any]]) -> None:
        """:meth:`check`, raising ``ValueError`` (bad input for this server)."""
        try:
            self.check(items)
        except LookupError as err:
            raise ValueError(str(err)) from None

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
        state, mine = self._generative(op, rows.data, base)
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
        with self._lock, self._writing():
            if self.follower is not None and self.log is None:
                return self._mirrored(op, data)
            if not isinstance(update, PreparedUpdate) or update.base_ids is not self.ids:
                update = self._prepared(op, data, self.ids)  # rows of another map: again
            elif update.base is not self.engine.catalog:  # a compaction or an update since
                update = self._prepared(op, data, self.ids, update.rows)  # the same rows
            rows, state = update.rows, update.state
            ranker_items = self._ranker_items(op, rows.data)
            version = self._version + 1
            if self.log is not None:  # on disk before anything is installed
                self.log.append(LogRecord(version, op, rows.data, rows.added))
            try:
                reported = self._rank(op, rows.data, ranker_items)
            except BaseException:
                if self.log is not None:  # refused: no record of it stays
                    self.log.discard_last()
                raise
            change = self._commit(state, reported, version, rows.ids)
            if self.follower is not None:
                self.follower.tail.state = self.log.tail_state()
        names = rows.ids.ids_of
        if state is not None:
            change.catalogs[GENERATIVE] = names(update.generative)
        if op == "upsert" and ranker_items:
            change.catalogs[RANKER] = names(it["item_id"] for it in ranker_items)
        elif op == "retire" and self.ranker_updater is not None:
            change.catalogs[RANKER] = names(rows.data)
        return change

    def _rank(self, op: str, data: list, ranker_items: list[dict[str, Any]] | None) -> Any:
        # the ranker's part of an update (what its updater reports; None: no call)
        if op == "upsert" and ranker_items:
            return self.ranker_updater.upsert(ranker_items)
        if op == "retire" and self.ranker_updater is not None:
            return self.ranker_updater.retire(data)
        return None

    @property
    def follows(self) -> bool:
        """Whether this catalog follows a state directory other processes write too."""
        return self.follower is not None

    def catch_up(self) -> int:
        """Apply what other processes logged since the last look (a follower, see
        :meth:`from_dir`; call it between batches); returns the version now served."""
        if self.follower is not None:
            with self._lock:
                self.follower.catch_up(self)
        return self._version

    def install_base(self, base: CatalogBase) -> None:
        """Replace both catalogs by a logged ``base`` (a follower behind a fold; under the
        lock)."""
        self._install_base(base)
        self._version = base.version

    def install_logged(self, record: LogRecord) -> None:
        """Apply an update another process logged, as its ``record`` says (a follower; under
        the lock). Raises ``ValueError`` when these catalogs refuse it."""
        self._checked(record.op, record.data)
        self._install_logged(record, *self._logged(record))

    def _logged(self, record: LogRecord) -> tuple[RowUpdate, CatalogState | None]:
        # a logged update onto the installed id map and state (under the lock): its rows and
        # the next generative state (None: unchanged); raises as the update's checks do
        rows = logged_rows(self.ids, record.data, record.ids)
        return rows, self._generative(record.op, record.data, self.engine.catalog)[0]

    def _install_logged(self, record: LogRecord, rows: RowUpdate,
                        state: CatalogState | None) -> None:
        # the ranker's part of a logged update, then both installed under its version (under
        # the lock); ``ValueError``: the ranker's updater refused it, nothing installed
        reported = self._rank(record.op, record.data, self._ranker_items(record.op, record.data))
        self._commit(state, reported, record.version, rows.ids, fold=False)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        # a write to a shared directory: its lock held, caught up to the log's end
        if self.follower is None or self.log is None:
            yield
            return
        with self.log.hold():
            self.follower.catch_up(self, cut=self.log.adopt)
            self.log.adopt(self.follower.tail.state)
            if self.log.version != self._version:
                raise RuntimeError(f"{self.log.path}: at version {self.log.version}, the "
                                   f"catalog at {self._version}")
            yield

    def _mirrored(self, op: str, data: list) -> CatalogChange:
        # a follower that does not write: the update was logged by the process that does (an
        # engine process); its version is the log's
        self.follower.catch_up(self)
        version = self.follower.logged(op, to_rows(self.ids, op, data, self.generative).data)
        if version is None:
            raise RuntimeError(f"{self.follower.tail.path}: the update is not in the log "
                               f"(version {self._version})")
        return CatalogChange(version)

    def _checked(self, op: str, data: list) -> None:
        # the input checks that need no catalog state
        if op not in ("upsert", "retire"):
            raise RuntimeError(f"unknown catalog operation {op!r}")
        if op == "upsert":
            self.check_input(data)

    def _ranker_items(self, op: str, rows: list) -> list[dict[str, Any]] | None:
        # the ranker's items of an upsert (in rows)
        return self.split(rows)[1] if op == "upsert" else None

    def _generative(self, op: str, data: list, catalog: CatalogState | None
                    ) -> tuple[CatalogState | None, list[int]]:
        # the next generative state (None: it does not change) and the item ids it takes
        if op == "upsert":
            sids, _ = self.split(data)
            mine = [i for i, sid in sids if sid is not None]
            return (catalog.updated(sids) if mine else None), mine  # validated, not installed
        if self.ranker_updater is None:
            if catalog is None:
                raise ValueError("item_ids: no catalog to retire items from")
            mine = data  # each must be known here: updated() names unknown ones
        else:
            n = catalog.num_items if catalog is not None else 0
            mine = [i for i in data if 0 <= i < n]
        return (catalog.updated(retire=mine) if mine else None), mine

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
