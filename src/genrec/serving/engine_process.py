"""The engine in its own process (``genrec serve --engine-process``).

In one process, the HTTP event loop and the engine's worker thread share one interpreter lock:
with a small model, whose batches are many short tensor operations, the request handling and
the engine take turns instead of running side by side. With ``--engine-process`` the engine
batches run in a child process (spawned, so it has its own interpreter and torch threads) that
builds a :class:`~genrec.serving.worker.Worker` over the same model, ranker and catalog, loaded
from the same :class:`~genrec.serving.spec.AppSpec`.

:class:`EngineProcess` is the server side's :class:`~genrec.serving.worker.BatchWorker`: the
scheduler's worker thread calls its :meth:`~EngineProcess.run`, which sends the batch
(:class:`~genrec.serving.messages.Batch`) through a pipe and waits for the
:class:`~genrec.serving.messages.Reply`. The server keeps a local worker of its own, over its
own copy, to check requests before they are queued (item ids, vector sizes, ...) and to
answer metadata. A catalog update runs in the child first and, when it succeeded there, on
the local worker (an update prepared in this process is sent as its plain
:class:`~genrec.serving.messages.CatalogOp`), so both stay at the same catalog version (the
update is deterministic; a mismatch is reported as an error).

The child's generative catalog compacts itself in the background (the engine that searches
lives there; :mod:`genrec.live_catalog.compaction`); so does the server's copy, independently (a
compaction changes no version, so the mirroring is unaffected). Every reply carries the
child's :class:`~genrec.live_catalog.compaction.CatalogStats`, which the server's ``/metrics``
reports.

Errors: a ``ValueError`` in the child (bad input) comes back as ``ValueError`` with the same
message (HTTP 422, and the scheduler's rerun-alone isolation still works); anything else as
``RuntimeError``. If the child dies, every call raises :class:`EngineGoneError` (HTTP 503),
and ``/health`` and ``/ready`` answer 503.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from genrec.catalog.id_map import IdMap
from genrec.live_catalog.compaction import CatalogStats, CompactionEvent
from genrec.live_catalog.update_plan import PreparedUpdate
from genrec.serving.messages import Batch, CatalogOp, CatalogUpdate, Message, Reply
from genrec.serving.worker import Worker

if TYPE_CHECKING:
    from genrec.serving.spec import AppSpec

_CLOSE = b""
_MAX_EVENTS = 1024


class EngineGoneError(RuntimeError):
    """The engine process exited or stopped answering (HTTP 503)."""


def _dump(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _portable(err: BaseException) -> BaseException:
    # exception types with their own constructors may not unpickle: send a plain one
    if isinstance(err, ValueError):
        return ValueError(str(err))
    return RuntimeError(f"{type(err).__name__}: {err}")


def _plain(update: Any) -> Any:
    # a prepared update holds this process's catalog states: the child gets its plain op
    return CatalogOp(update.op, update.data) if isinstance(update, PreparedUpdate) else update


def _child_main(spec: AppSpec, conn: Any) -> None:
    """The engine process: load, report ready, then run batches until told to stop."""
    # Ctrl-C reaches the whole process group: the server drains first, then closes this
    # process (or it exits when the server's end of the pipe closes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        from genrec.serving.components import build_worker, load_components
        from genrec.serving.uvicorn_server import freeze_heap

        worker = build_worker(load_components(spec), spec.config)
        freeze_heap()  # loaded: full collections skip it from now on
        conn.send_bytes(_dump(Reply(True, None)))
    except BaseException as err:  # noqa: BLE001 - reported to the server, which stops
        conn.send_bytes(_dump(Reply(False, _portable(err))))
        return
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if data == _CLOSE:
            worker.close()
            return
        batch: Batch = pickle.loads(data)
        try:
            reply = Reply(True, list(worker.run(batch.message, batch.payloads)),
                          worker.catalog_stats())
        except BaseException as err:  # noqa: BLE001 - the batch's error, sent back
            reply = Reply(False, _portable(err), worker.catalog_stats())
        conn.send_bytes(_dump(reply))


class EngineProcess:
    """A child process running the batches of ``local``'s server (see the module
    docstring): a :class:`~genrec.serving.worker.BatchWorker` whose ``engine``, ``ranker``
    and ``catalog`` are ``local``'s.

    Starts on construction and waits until the child has loaded everything (raises
    ``RuntimeError`` with the child's error otherwise); :meth:`close` stops it.
    """

    def __init__(self, spec: AppSpec, local: Worker, start_timeout_s: float = 600.0) -> None:
        self.local = local
        # this process's copies: requests are checked against them
        self.engine, self.ranker, self.catalog = local.engine, local.ranker, local.catalog
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, args=(spec, child_conn),
                                 name="genrec-engine", daemon=True)
        self._proc.start()
        child_conn.close()
        self._lock = threading.Lock()
        self._delta_items: int | None = None
        self._compacting = False
        self._events: deque[CompactionEvent] = deque(maxlen=_MAX_EVENTS)
        reply = self._receive(start_timeout_s)
        if not reply.ok:
            self.close()
            raise RuntimeError(f"the engine process failed to start: {reply.value}")

    @property
    def catalog_version(self) -> int:
        """The one catalog version (the child's, mirrored here)."""
        return self.local.catalog_version

    @property
    def ids(self) -> IdMap:
        """The table's item ids (the local copy's, mirrored from the child's log)."""
        return self.local.ids

    def sync(self, timeout_s: float | None = None) -> int:
        """The local worker's :meth:`~genrec.serving.worker.Worker.sync` (its copy follows
        the log the child writes)."""
        return self.local.sync(timeout_s)

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the child process is running."""
        return self._proc.is_alive()

    def _receive(self, timeout_s: float | None = None) -> Reply:
        waited = 0.0
        while not self._conn.poll(1.0):
            waited += 1.0
            if not self._proc.is_alive():
                raise EngineGoneError(f"the engine process exited (code {self._proc.exitcode})")
            if timeout_s is not None and waited >= timeout_s:
                raise EngineGoneError(f"the engine process did not answer in {timeout_s:.0f} s")
        try:
            return pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as err:
            raise EngineGoneError(f"the engine process is gone ({err})") from None

    def call(self, message: Message, payloads: list[Any]) -> list[Any]:
        """Run one batch in the child alone; its results, or its error raised here."""
        with self._lock:
            try:
                self._conn.send_bytes(_dump(Batch(message, [_plain(p) for p in payloads])))
            except (OSError, ValueError) as err:
                raise EngineGoneError(f"the engine process is gone ({err})") from None
            reply = self._receive()
            if reply.catalog is not None:
                self._delta_items = reply.catalog.delta_items
                self._compacting = reply.catalog.compacting
                self._events.extend(reply.catalog.compactions)
        if not reply.ok:
            raise reply.value
        return reply.value

    def run(self, message: Message, payloads: list[Any]) -> list[Any]:
        """The scheduler's runner: the batch runs in the child; a catalog update then runs on
        the local worker too, when it succeeded there."""
        results = self.call(message, payloads)
        if isinstance(message, CatalogUpdate):
            remote = [change.version for change in results]
            here = [change.version for change in self.local.run(message, payloads)]
            if remote != here:
                raise RuntimeError(f"catalog versions diverged: engine process {remote}, "
                                   f"server {here}")
        return results

    def catalog_stats(self) -> CatalogStats | None:
        """The child's generative catalog as of its last answer (``None``: none reported);
        the compactions it reported since the last call."""
        if self._delta_items is None:
            return None
        events = []
        while self._events:  # deque pops are atomic: no lock against call()
            events.append(self._events.popleft())
        return CatalogStats(self._delta_items, self._compacting, tuple(events))

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child (it finishes the batch it runs), killing it after ``timeout_s``;
        then close the local worker."""
        if self._proc.is_alive():
            try:
                with self._lock:
                    self._conn.send_bytes(_CLOSE)
            except (OSError, ValueError):
                pass
            self._proc.join(timeout_s)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout_s)
        self._conn.close()
        self.local.close()
