"""The demo's server: genrec's HTTP API in-process, one real ``POST /v1/recommend`` for a
sample user (printed with its answer), what to run on your own data, then serving until Ctrl-C.

The request goes through the network stack with ``urllib`` (standard library), exactly as any
client's would; the server is the one ``genrec serve`` runs (``create_app`` under uvicorn).
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from genrec.demo.synthetic import SyntheticData, item_name, item_row
from genrec.engine import Engine
from genrec.serving import BackgroundServer, ServeConfig, create_app

Echo = Callable[[str], None]
# loopback needs no proxy: ignore http_proxy / https_proxy from the environment
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def check_port(port: int | None) -> None:
    """Raise OSError now (before any training) when ``port`` on 127.0.0.1 cannot be bound."""
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise OSError(f"port {port} on 127.0.0.1 is not available ({err.strerror})") from None


def start_server(engine: Engine, port: int | None = None) -> BackgroundServer:
    """genrec's server around ``engine`` on 127.0.0.1 (``port``, or a free one), started."""
    app = create_app(engine, config=ServeConfig(model_name="genrec-demo"))
    return BackgroundServer(app, host="127.0.0.1", port=port or None).start()


def post_json(url: str, body: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """POST ``body`` as JSON, return the JSON answer; an HTTP error raises RuntimeError."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"POST {url}: HTTP {err.code}: {err.read().decode()}") from None


def print_exchange(
    echo: Echo, data: SyntheticData, user: int, url: str, body: dict[str, Any],
    answer: dict[str, Any], target: int, ms: float,
) -> None:
    """The request and the answer as sent and received, then the answer annotated."""
    clusters = data.item_cluster
    history = [item_row(i) for i in body["history"]]
    echo(f"\nsample held-out user {user} (preferred cluster {int(data.preferred[user])}), "
         f"history of {len(history)} items, oldest first; clusters: "
         + " ".join(str(int(clusters[i])) for i in history))
    echo(f"request: POST {url}")
    echo("  " + json.dumps(body))
    echo(f"answer ({ms:.0f} ms):")
    echo("  " + json.dumps(answer))
    echo(f"  {'rank':>4} {'item':>10} {'cluster':>7} {'score':>8}")
    current = int(clusters[history[-1]])
    items = [item_row(i) for i in answer["items"]]
    for rank, (item, score) in enumerate(zip(items, answer["scores"], strict=True), 1):
        note = ""
        if item == target:
            note = "<- true next item (held out)"
        elif int(clusters[item]) == current:
            note = "same cluster as last item"
        echo(f"  {rank:>4} {item_name(item):>10} {int(clusters[item]):>7} {score:>8.3f}  "
             f"{note}".rstrip())
    if target not in items:
        echo(f"  (the true next item, {item_name(target)}, cluster {int(clusters[target])}, "
             f"is not in this top {len(items)})")


def print_next_steps(echo: Echo, out: Path) -> None:
    """How to run the same thing on your own data and model."""
    body = json.dumps({"history": ["B0002L5R78", "B000FQ2JLW", "B0006GVNOA"], "n": 10})
    echo("\nyour own data and model (DATA: a folder of *.inter.json [+ *.item.json]; or "
         "--interactions FILE.csv [--items FILE.csv] instead of --data); requests and "
         "answers name items by your table's item ids:")
    echo("  genrec index --data DATA --from-text --out runs/my/index.json")
    echo("  genrec train generative --data DATA --index runs/my/index.json --out runs/my/model")
    echo("      (add --init-from HF_CHECKPOINT to fine-tune a pretrained decoder)")
    echo("  genrec serve runs/my/model --port 8000   # a run folder serves its best checkpoint")
    echo("  curl -s http://127.0.0.1:8000/v1/recommend -H 'Content-Type: application/json' "
         f"-d '{body}'")
    echo(f"this demo's model serves the same way: genrec serve --model {out}")


def serve_until_interrupted(server: BackgroundServer, echo: Echo) -> None:
    """Keep ``server`` running until Ctrl-C (or SIGTERM), then drain and stop it."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)
    echo(f"\nserving on {server.url} (Ctrl-C to stop)")
    try:
        while server.thread.is_alive():
            time.sleep(0.2)  # not thread.join: an interrupted join leaves is_alive() wrong
    except KeyboardInterrupt:
        echo("stopping the server")
    finally:
        server.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
