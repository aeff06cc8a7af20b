"""The app served by uvicorn in the background: it answers on its url, and stopping it drains
like SIGTERM (the app marked draining, its scheduler refusing new work) before the thread
ends."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from genrec.serving.scheduler import BatchScheduler, DrainingError
from genrec.serving.uvicorn_server import BackgroundServer


def test_a_background_server_answers_then_drains_on_stop() -> None:
    app = FastAPI()
    app.state.draining = False
    app.state.scheduler = BatchScheduler(lambda group, payloads: payloads)

    @app.get("/ping")
    def ping() -> dict:
        return {"draining": app.state.draining}

    server = BackgroundServer(app).start()
    assert httpx.get(server.url + "/ping", timeout=10).json() == {"draining": False}
    server.stop()
    assert not server.thread.is_alive() and app.state.draining
    assert not app.state.scheduler.accepting
    with pytest.raises(DrainingError):
        asyncio.run(app.state.scheduler.submit("g", 1))
    assert app.state.scheduler.close(10)
