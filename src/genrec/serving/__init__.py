"""HTTP serving (``genrec serve``): FastAPI app, dynamic batching, metrics, uvicorn runner.

Needs the ``serve`` extras (fastapi, uvicorn, prometheus-client).
"""

from genrec.serving.app import ServeConfig, create_app
from genrec.serving.backends import CatalogUpdater, Ranker, RankRequest
from genrec.serving.scheduler import BatchScheduler
from genrec.serving.server import BackgroundServer, run_server

__all__ = [
    "BackgroundServer", "BatchScheduler", "CatalogUpdater", "RankRequest", "Ranker",
    "ServeConfig", "create_app", "run_server",
]
