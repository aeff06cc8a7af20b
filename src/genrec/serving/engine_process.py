"""The engine in its own process (``genrec serve --engine-process``).

In one process, the HTTP event loop and the engine's worker thread share one interpreter lock:
with a small model, whose batches are many short tensor operations, the request handling and
the engine take turns instead of running side by side. With ``--engine-process`` the engine
batches run in a child process (spawned, so it has its own interpreter and torch threads) that
loads the same model, ranker and catalog from the same :class:`~genrec.serving.ray_app.AppSpec`.

The server process keeps its own copy to check requests before they are queued (item ids,
vector sizes, ...) and to answer metadata; the scheduler's worker thread sends each batch
``(group, payloads)`` through a pipe and waits for the results (the batch runner of
:func:`genrec.serving.backends.make_runner`, run in the child). A catalog update runs in the
child first and, when it succeeded, the same update runs on the server's copy, so both stay at
the same catalog version (the update is deterministic; a mismatch is reported as an error).

The child's generative catalog compacts itself in the background (the engine that searches
lives there; :mod:`genrec.serving.compaction`); so does the server's copy, independently (a
compaction changes no version, so the mirroring is unaffected). Every :class:`Reply` carries
the child's :class:`~genrec.serving.compaction.CatalogStats`, which the server's ``/metrics``
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
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genrec.serving.compaction import CatalogStats, CompactionEvent

if TYPE_CHECKING:
    from genrec.serving.ray_app import AppSpec

Runner = Callable[[Hashable, list[Any]], Sequence[Any]]
_CLOSE = b""
_MAX_EVENTS = 1024


@dataclass(frozen=True)
class Request:
    """A batch for the engine process: the scheduler's group and its payloads."""

    group: Hashable
    payloads: list[Any]


@dataclass(frozen=True)
class Reply:
    """The engine process's answer: ``ok`` and the results (or the error), and where its
    generative catalog stands (``None``: it has none)."""

    ok: bool
    value: Any
    catalog: CatalogStats | None = None


class EngineGoneError(RuntimeError):
    """The engine process exited or stopped answering (HTTP 503)."""


def _dump(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _portable(err: BaseException) -> BaseException:
    # exception types with their own constructors may not unpickle: send a plain one
    if isinstance(err, ValueError):
        return ValueError(str(err))
    return RuntimeError(f"{type(err).__name__}: {err}")


def _child_main(spec: AppSpec, conn: Any) -> None:
    """The engine process: load, report ready, then run batches until told to stop."""
    # Ctrl-C reaches the whole process group: the server drains first, then closes this
    # process (or it exits when the server's end of the pipe closes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        from genrec.serving.backends import make_runner
        from genrec.serving.ray_app import load_components
        from genrec.serving.server import freeze_heap
        from genrec.serving.service import Service

        parts = load_components(spec)
        service = Service(parts.engine, None, parts.ranker, parts.updater,  # type: ignore[arg-type]
                          parts.tokenizer, compact_threshold=spec.config.compact_threshold)
        run = make_runner(parts.engine, parts.ranker, service.catalog_version,
                          lambda: service.catalog)
        freeze_heap()  # loaded: full collections skip it from now on
        conn.send_bytes(_dump(Reply(True, None)))
    except BaseException as err:  # noqa: BLE001 - reported to the server, which stops
        conn.send_bytes(_dump(Reply(False, _portable(err))))
        return

    def stats() -> CatalogStats | None:
        generative = service.catalog is not None and service.catalog.generative
        return service.catalog.stats() if generative else None

    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if message == _CLOSE:
            if service.catalog is not None:
                service.catalog.close()
            return
        request: Request = pickle.loads(message)
        try:
            data = _dump(Reply(True, list(run(request.group, request.payloads)), stats()))
        except BaseException as err:  # noqa: BLE001 - the batch's error, sent back
            data = _dump(Reply(False, _portable(err), stats()))
        conn.send_bytes(data)


class EngineProcess:
    """A child process running engine batches for the server (see the module docstring).

    Starts on construction and waits until the child has loaded everything (raises
    ``RuntimeError`` with the child's error otherwise); :meth:`close` stops it.
    """

    def __init__(self, spec: AppSpec, start_timeout_s: float = 600.0) -> None:
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
    def pid(self) -> int | None:
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

    def call(self, group: Hashable, payloads: list[Any]) -> list[Any]:
        """Run one batch in the child; its results, or its error raised here."""
        with self._lock:
            try:
                self._conn.send_bytes(_dump(Request(group, payloads)))
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

    def catalog_stats(self) -> CatalogStats | None:
        """The child's generative catalog as of its last answer (``None``: none reported);
        the compactions it reported since the last call."""
        if self._delta_items is None:
            return None
        events = []
        while self._events:  # deque pops are atomic: no lock against call()
            events.append(self._events.popleft())
        return CatalogStats(self._delta_items, self._compacting, tuple(events))

    def runner(self, local: Runner) -> Runner:
        """The scheduler's runner: batches run in the child; catalog updates run in the child,
        then on ``local`` (this process's copy) when they succeeded there."""
        def run(group: Hashable, payloads: list[Any]) -> Sequence[Any]:
            results = self.call(group, payloads)
            if group[0] == "catalog":
                mirrored = list(local(group, payloads))
                remote = [getattr(r, "version", r) for r in results]
                here = [getattr(r, "version", r) for r in mirrored]
                if remote != here:
                    raise RuntimeError(f"catalog versions diverged: engine process {remote}, "
                                       f"server {here}")
            return results

        return run

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child (it finishes the batch it runs), killing it after ``timeout_s``."""
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
