"""Scale-out: the same FastAPI application as a Ray Serve deployment of N replicas
(``genrec serve --ray --replicas N``).

Each replica is a separate process that loads the model itself from the same paths (one
:class:`~genrec.serving.spec.AppSpec`) and builds the app with
:func:`~genrec.serving.app_loader.load_app`, the loader of the single-process ``genrec serve``:
routes, dynamic batching, errors, draining and metrics are the same, per replica. Ray
Serve's HTTP proxy listens on the given host and port and spreads the requests over the
replicas; every answer carries ``X-Genrec-Replica``, the id of the replica that served it.

Per replica: ``/metrics`` (a scrape through the proxy reaches one replica). Shared: the
catalog, through its state directory (``ServeConfig.catalog_state``): every replica replays
it on start and follows its log (:mod:`genrec.live_catalog.follow`), so an update taken by
any replica reaches all of them in the log's order, and ``min_catalog_version`` reads a write
on whichever replica answers. Without a state directory (``--volatile-catalog``) each replica
would hold its own catalog: catalog updates are then refused with 400 when there is more than
one replica.

Needs the ``ray`` extras: ``pip install 'genrec[ray]'`` (Ray Serve >= 2.47, whose
``serve.ingress`` accepts a function that builds the app on each replica). This module
imports Ray only inside its functions.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from genrec.serving.app_loader import load_app
from genrec.serving.spec import AppSpec
from genrec.serving.uvicorn_server import freeze_heap

if TYPE_CHECKING:
    from fastapi import FastAPI

REPLICA_HEADER = "X-Genrec-Replica"
APP_NAME = "genrec"
CATALOG_PATH = "/v1/catalog/items"
RAY_MISSING = "--ray needs Ray Serve: pip install 'genrec[ray]'"


class ReplicaMiddleware:
    """ASGI middleware: adds ``X-Genrec-Replica: <replica>`` to every answer and, when the
    catalog is not shared (several replicas), refuses catalog updates with 400."""

    def __init__(self, app: Any, replica: str, refuse_catalog: bool = False) -> None:
        self.app, self.refuse_catalog = app, refuse_catalog
        self.header = (REPLICA_HEADER.lower().encode(), replica.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        if self.refuse_catalog and scope["path"] == CATALOG_PATH:
            from fastapi.responses import JSONResponse

            reply = JSONResponse({"detail": "catalog updates are not available with several "
                                            "Ray Serve replicas and no shared catalog state "
                                            "(each holds its own catalog)"},
                                 status_code=400)
            await reply(scope, receive, send_with_header)
            return
        await self.app(scope, receive, send_with_header)


def replica_id() -> str:
    """This Ray Serve replica's id (the process id outside a replica)."""
    try:
        from ray import serve

        context = serve.get_replica_context()
        rid = getattr(context, "replica_id", None)
        return str(getattr(rid, "unique_id", None) or rid or os.getpid())
    except Exception:  # not in a replica
        return f"pid-{os.getpid()}"


def refuses_catalog(spec: AppSpec, replicas: int) -> bool:
    """Whether ``replicas`` replicas of ``spec`` refuse catalog updates: several, and no state
    directory they share (each would hold its own catalog)."""
    return replicas > 1 and spec.config.catalog_state is None


def replica_app(spec: AppSpec, replicas: int) -> FastAPI:
    """The app of one replica: :func:`load_app`, with the replica header (and catalog updates
    refused when ``replicas > 1`` and there is no shared state directory). Called by Ray
    Serve in each replica process."""
    device = spec.device
    if device.startswith("cuda"):  # Ray gives each replica its GPU as the only visible one
        device = "cuda"
    app = load_app(spec, device=device)
    app.add_middleware(ReplicaMiddleware, replica=replica_id(),
                       refuse_catalog=refuses_catalog(spec, replicas))
    freeze_heap()  # a replica is a serving process: full collections skip what it loaded
    return app


def _wants_gpu(device: str) -> bool:
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


def deployment(spec: AppSpec, replicas: int) -> Any:
    """The Ray Serve application: ``replicas`` replicas, each building its app on start."""
    from ray import serve

    def build() -> FastAPI:  # a function: evaluated in each replica, not pickled as an app
        return replica_app(spec, replicas)

    config = spec.config
    options = {"num_cpus": spec.threads or 1, "num_gpus": 1 if _wants_gpu(spec.device) else 0}
    return serve.deployment(
        serve.ingress(build)(), name=APP_NAME, num_replicas=replicas,
        ray_actor_options=options,
        # the app's own queue bound answers 503: let it see the requests
        max_ongoing_requests=config.max_batch_size + config.max_queue,
        graceful_shutdown_timeout_s=config.drain_timeout_s,
    ).bind()


def start(spec: AppSpec, replicas: int, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Deploy ``replicas`` replicas behind Ray Serve's HTTP proxy on ``host:port`` and wait
    until they are up. Joins the Ray cluster at ``RAY_ADDRESS`` if set (or one already
    initialised in this process), else starts a local one with enough CPUs for the replicas.

    Raises ValueError for a missing path, RuntimeError when the replicas do not start (e.g.
    the model fails to load).
    """
    import ray
    from ray import serve

    if replicas < 1:
        raise ValueError(f"replicas: must be at least 1, got {replicas}")
    spec.check()
    # Ray Serve's proxy health checks time out after 5-10 s; on a small, busy machine the proxy
    # can miss them while replicas load their models. A local Ray inherits these from here.
    for name, seconds in (("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60"),
                          ("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")):
        os.environ.setdefault(name, seconds)
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
        else:
            cpus = max(os.cpu_count() or 1, replicas * (spec.threads or 1))
            ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(spec, replicas), name=APP_NAME, route_prefix="/")


def shutdown() -> None:
    """Stop Ray Serve (replicas drain: in-flight and queued requests complete) and Ray."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def run(spec: AppSpec, replicas: int, host: str = "127.0.0.1", port: int = 8000,
        echo: Callable[[str], None] = print) -> None:
    """Serve until SIGINT / SIGTERM, then shut Ray Serve down and return."""
    stop = threading.Event()
    previous: dict[int, Any] = {}
    try:
        start(spec, replicas, host, port)
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
        echo(f"genrec: {replicas} Ray Serve replica(s) on http://{host}:{port} "
             f"(Ctrl-C or SIGTERM to stop)")
        while not stop.wait(0.5):
            pass
        echo("genrec: shutting down Ray Serve")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutdown()
