"""The served catalog's state directory, as the catalog uses it: opened on start
(:func:`open_dir`, behind :meth:`genrec.live_catalog.served.ServiceCatalog.from_dir`), its base
and logged updates replayed onto the catalogs as the server loaded them (:func:`replay`), the
version restored; written under its lock when shared (:func:`shared_write`), or only read by a
mirror (:func:`mirrored_version`).

Durability: an update is validated and its generative state built, then its record appended
and fsynced (:mod:`genrec.live_catalog.log`), then the ranker's updater runs and the
generative state is installed: what is acknowledged is on disk, nothing is seen before. The
ranker's updater validates as it runs: when it refuses, the record is cut off again (no record
of a refused update stays); should the process die in between (no answer sent), the replay
meets the same refusal (an updater's ``ValueError`` depends on its input and table only) at
the log's tail and drops the record. With a log each update takes exactly the next version.

Several processes can serve one state directory (``follow``; see
:mod:`genrec.live_catalog.follow`): each applies what the others log (between batches, on the
path of a local update), and an update holds the directory's lock from its catch-up to the
log's end to its append (:func:`shared_write`), so the log is the one order of everyone's
updates and every version is the log's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from genrec.live_catalog.follow import Followed, LogFollower, LogTail
from genrec.live_catalog.log import CatalogLog, FoldPolicy
from genrec.live_catalog.log_format import CatalogLogError, LogRecord
from genrec.live_catalog.stored import StoredCatalog, read_followed

if TYPE_CHECKING:
    from genrec.live_catalog.base import CatalogBase
    from genrec.live_catalog.ids import RowUpdate
    from genrec.live_catalog.state import CatalogState

logger = logging.getLogger("genrec.serving")


class Replayed(Protocol):
    """A catalog a state directory is replayed onto (its ``lock`` serialises installs)."""

    lock: contextlib.AbstractContextManager[Any]

    def check(self, items: list[dict[str, Any]]) -> None:
        """``LookupError`` naming the field: what this server cannot do at all."""
        ...

    def install_base(self, base: CatalogBase) -> None:
        """Replace the catalogs by ``base``."""
        ...

    def install_records(self, records: Sequence[LogRecord], where: str) -> None:
        """Install ``records`` (of ``where``) as one net change per catalog (under the
        lock)."""
        ...

    def plan_logged(self, record: LogRecord) -> tuple[RowUpdate, CatalogState | None]:
        """``record``'s rows and next generative state (under the lock)."""
        ...

    def install_planned(self, record: LogRecord, rows: RowUpdate,
                        state: CatalogState | None) -> None:
        """Install a planned logged update; ``ValueError``: the ranker refused it."""
        ...

    def attach(self, log: CatalogLog | None, follower: LogFollower | None = None) -> None:
        """Log later updates to ``log``; follow other processes' with ``follower``."""
        ...


C = TypeVar("C", bound=Replayed)


def open_dir(make: Callable[[int], C], state_dir: str | Path, version: int = 0,
             fold: FoldPolicy | None = None, writable: bool = True, follow: bool = False) -> C:
    """The catalog ``make(version)`` builds (its catalogs as the server loads them), with
    ``state_dir``'s base and records replayed onto it, then its log attached. ``version``:
    where a new directory starts (an existing one's wins); ``fold``: log size that starts a
    background fold; ``writable=False``: replay only, later updates in memory; ``follow``:
    the directory is shared with other processes. Raises ``CatalogLogError`` when it cannot
    be replayed here."""
    if writable:
        log, stored = CatalogLog.open(state_dir, version, fold or FoldPolicy(), follow)
        position = log.tail_state()
    else:
        log, (stored, position) = None, read_followed(state_dir, version)
    try:
        catalog = make(stored.after)
        if stored.base is not None:
            catalog.install_base(stored.base)
        refused = replay(catalog, stored, Path(state_dir))
        follower = None
        if follow:
            follower = LogFollower(LogTail(state_dir, position))
            if refused:  # cut off by the next write, under the directory's lock
                follower.tail.rewind()
        elif refused and log is not None:
            log.discard_last()
        catalog.attach(log, follower)
    except BaseException:
        if log is not None:
            log.close()
        raise
    return catalog


def replay(catalog: Replayed, stored: StoredCatalog, where: Path) -> bool:
    """Install ``stored``'s records onto ``catalog``: all but the last as one net change per
    catalog (a few calls however many they are), then the last one alone. True when the
    ranker refused the last (never acknowledged: it is to be dropped). Each is installed
    from its rows under the lock, so a compaction the head started cannot swap the state
    between reading it and installing onto it. Raises ``CatalogLogError`` when the records
    cannot be replayed here."""
    head, last = stored.records[:-1], stored.records[-1:]
    span = f"versions {stored.after + 1}..{stored.version}"
    try:
        for record in stored.records:
            if record.op == "upsert":
                catalog.check(record.data)
        if head:
            with catalog.lock:
                catalog.install_records(head, str(where))
    except (LookupError, ValueError) as err:  # each was validated before it was logged
        raise CatalogLogError(f"{where}: {span} cannot be replayed here: {err}") from err
    for record in last:
        with catalog.lock:
            try:
                rows, state = catalog.plan_logged(record)
            except (LookupError, ValueError) as err:
                raise CatalogLogError(f"{where}: {span} cannot be replayed here: "
                                      f"{err}") from err
            try:
                catalog.install_planned(record, rows, state)
            except ValueError as err:  # the ranker's updater refused it: never acknowledged
                logger.warning("%s: the last update (version %d), refused on replay, was "
                               "never acknowledged: dropped (%s)", where, record.version, err)
                return True
    return False


@contextlib.contextmanager
def shared_write(catalog: Followed, log: CatalogLog | None,
                 follower: LogFollower | None) -> Iterator[None]:
    """Around a write of ``catalog`` to a shared directory (a ``follower`` with a ``log``):
    the directory's lock held, the catalog caught up to the log's end (a refused record there
    a dead writer's, cut off). Nothing to do otherwise."""
    if follower is None or log is None:
        yield
        return
    with log.hold():
        follower.catch_up(catalog, cut=log.adopt)
        log.adopt(follower.tail.state)
        if log.version != catalog.catalog_version:
            raise RuntimeError(f"{log.path}: at version {log.version}, the "
                               f"catalog at {catalog.catalog_version}")
        yield


def mirrored_version(catalog: Followed, follower: LogFollower, op: str, rows: list) -> int:
    """The version of an update (``rows``) that the process which writes the directory (an
    engine process) logged, ``catalog`` caught up to it first (a follower that does not
    write)."""
    follower.catch_up(catalog)
    version = follower.logged(op, rows)
    if version is None:
        raise RuntimeError(f"{follower.tail.path}: the update is not in the log "
                           f"(version {catalog.catalog_version})")
    return version
