"""HTTP serving (``genrec serve``): FastAPI app, dynamic batching, metrics, uvicorn runner.

A request goes route (:mod:`~genrec.serving.routes`) -> :class:`~genrec.serving.endpoints.Service`
(checks it alone) -> :class:`BatchScheduler` (batches by message,
:mod:`~genrec.serving.messages`) -> :class:`Worker` (or the engine-process proxy) -> engine.

Needs the ``serve`` extras (fastapi, uvicorn, prometheus-client).
"""

from genrec.duolm.requests import RowRankRequest
from genrec.serving.backends import CatalogUpdater, Ranker
from genrec.serving.http_app import build_app, create_app
from genrec.serving.scheduler import BatchScheduler
from genrec.serving.spec import ServeConfig
from genrec.serving.uvicorn_server import BackgroundServer, run_server
from genrec.serving.worker import BatchWorker, Worker

__all__ = [
    "BackgroundServer", "BatchScheduler", "BatchWorker", "CatalogUpdater", "Ranker",
    "RowRankRequest", "ServeConfig", "Worker", "build_app", "create_app", "run_server",
]
