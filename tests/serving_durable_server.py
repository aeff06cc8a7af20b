"""A generative server whose catalog lives in a state directory, run as its own process by the
durability test (not a test module).

    python serving_durable_server.py STATE_DIR PORT
    python serving_durable_server.py --fork

Serves a tiny random model over :data:`N_ITEMS` items (:func:`durable_engine`) on
127.0.0.1:PORT until killed. Catalog updates (``PUT`` / ``DELETE /v1/catalog/items``) go to a
:class:`~genrec.live_catalog.served.ServiceCatalog` kept in STATE_DIR (replayed on start; a fold
every :data:`FOLD_RECORDS` records, a compaction every :data:`COMPACT_ITEMS` delta items).

``--fork``: import once, then serve each ``start STATE_DIR PORT`` line of stdin from a forked
process (answering ``started PID``: a restart without the seconds of imports) and SIGKILL it
on ``kill PID`` (answering ``killed PID`` once it is gone); the servers left are killed at the
end of stdin.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from serving_load_server import engine_for

from genrec import Engine

SIZES = [16, 16, 8]
N_ITEMS = 64
FOLD_RECORDS = 5
COMPACT_ITEMS = 8


def item_name(row: int) -> str:
    """The table id of the item in ``row`` (items added later are named the same way)."""
    return f"song-{row:05d}"


def durable_engine() -> Engine:
    """The tiny random model over :data:`N_ITEMS` random distinct Semantic IDs (the same one
    in every process), its items named by :func:`item_name`."""
    g = torch.Generator().manual_seed(0)
    space = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    return engine_for(space[torch.randperm(space.shape[0], generator=g)[:N_ITEMS]], SIZES,
                      [item_name(i) for i in range(N_ITEMS)])


def serve(state_dir: str, port: int) -> None:
    """Serve the model with its catalog in ``state_dir`` on loopback ``port``, until killed."""
    from genrec.live_catalog.log import FoldPolicy
    from genrec.live_catalog.served import ServiceCatalog
    from genrec.serving import ServeConfig, create_app, run_server

    torch.set_num_threads(1)
    engine = durable_engine()
    catalog = ServiceCatalog.from_dir(engine, None, state_dir, compact_threshold=COMPACT_ITEMS,
                                      fold=FoldPolicy(records=FOLD_RECORDS, bytes=0))
    app = create_app(engine, catalog_updater=catalog, config=ServeConfig(max_wait_ms=1))
    run_server(app, host="127.0.0.1", port=port, log_level="warning")


def serve_forked() -> None:
    """The ``--fork`` loop (see the module docstring)."""
    import genrec.live_catalog.served  # noqa: F401
    import genrec.serving  # noqa: F401 - the server's imports, once, before any fork

    alive: set[int] = set()
    for line in sys.stdin:
        command, *args = line.split()
        if command == "start":
            pid = os.fork()
            if pid == 0:  # the server: its output away from the answers
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                try:
                    serve(args[0], int(args[1]))
                finally:
                    os._exit(0)
            alive.add(pid)
            print("started", pid, flush=True)
        elif command == "kill":
            pid = int(args[0])
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            alive.discard(pid)
            print("killed", pid, flush=True)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    if sys.argv[1:] == ["--fork"]:
        serve_forked()
    else:
        serve(sys.argv[1], int(sys.argv[2]))
