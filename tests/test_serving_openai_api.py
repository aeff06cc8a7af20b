"""The OpenAI-style routes as OpenAI's clients expect them: ``GET /v1/models``, 404 for another
model, errors in OpenAI's shape (genrec's own routes keep ``detail``), and the ``openai`` SDK
against a real ``python -m genrec serve MODEL`` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving_support import (  # noqa: F401 (fixtures)
    checkpoint,
    engine,
    error_message,
    is_ready,
    post,
    wait_until,
)

from genrec import Engine
from genrec.serving import BackgroundServer, ServeConfig, create_app
from genrec.serving.completions import item_text
from genrec.serving.openai_api import openai_error
from genrec.serving.uvicorn_server import free_port

HISTORY = [3, 17, 8]


@pytest.fixture(scope="module")
def named(engine: Engine) -> Iterator[str]:  # noqa: F811
    config = ServeConfig(model_name="tiny-rec", max_body_bytes=4096, api_key="k-api-1")
    with BackgroundServer(create_app(engine, config=config)) as server:
        yield server.url


@pytest.fixture(scope="module")
def prompt(engine: Engine) -> dict:  # noqa: F811
    """A completion body of a three-item history (its Semantic-ID text)."""
    return {"prompt": " ".join(item_text(engine.catalog, i) for i in HISTORY),
            "use_beam_search": True, "n": 2}


def auth(**kw: object) -> dict:
    return {"headers": {"Authorization": "Bearer k-api-1"}, **kw}


def test_openai_error_names_the_field() -> None:
    assert openai_error(422, "prompt: must start with the BOS token id 0") == {"error": {
        "message": "prompt: must start with the BOS token id 0",
        "type": "UnprocessableEntityError", "param": "prompt", "code": 422}}
    assert openai_error(503, "server is shutting down")["error"]["param"] is None
    assert openai_error(422, "items[3].text: too long")["error"]["param"] == "items[3].text"


def test_models_lists_the_served_name(named: str) -> None:
    r = httpx.get(named + "/v1/models", **auth())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny-rec"]
    card = body["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "genrec"
    assert isinstance(card["created"], int)
    one = httpx.get(named + "/v1/models/tiny-rec", **auth())
    assert one.status_code == 200 and one.json() == card
    other = httpx.get(named + "/v1/models/gpt-4", **auth())
    assert other.status_code == 404 and "'gpt-4' does not exist" in error_message(other)
    assert other.json()["error"]["param"] == "model"


def test_completions_naming_another_model_is_404(named: str, prompt: dict) -> None:
    r = post(named, "/v1/completions", {**prompt, "model": "gpt-4"}, **auth())
    assert r.status_code == 404 and error_message(r).startswith("model: the model 'gpt-4'")
    assert r.json()["error"]["type"] == "NotFoundError"
    ok = post(named, "/v1/completions", {**prompt, "model": "tiny-rec"}, **auth())
    assert ok.status_code == 200 and ok.json()["model"] == "tiny-rec", ok.text
    assert post(named, "/v1/completions", prompt, **auth()).status_code == 200


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"prompt": [0], "use_beam_search": True, "n": 0}, 422, "n"),
    ({"prompt": [5, 6, 7], "use_beam_search": True}, 422, "prompt"),
    ({"prompt": [0], "use_beam_search": True, "n": 5, "best_of": 2}, 422, "n"),
    ({"prompt": [0]}, 400, "use_beam_search"),
    ({"prompt": [0] * 5000, "use_beam_search": True}, 413, "body"),
])
def test_completions_errors_in_openai_shape(named: str, body: dict, status: int,
                                            param: str) -> None:
    r = post(named, "/v1/completions", body, **auth())
    assert r.status_code == status, r.text
    error_message(r)
    assert r.json()["error"]["param"] == param


def test_other_errors_of_openai_routes_and_genrec_routes(
        named: str, engine: Engine, prompt: dict) -> None:  # noqa: F811
    no_key = httpx.get(named + "/v1/models")
    assert no_key.status_code == 401 and no_key.headers["www-authenticate"] == "Bearer"
    assert "error" in no_key.json() and error_message(no_key)
    # genrec's own routes keep {"detail": ...} naming the field
    r = post(named, "/v1/recommend", {"history": [999]}, **auth())
    assert r.status_code == 422 and error_message(r).startswith("history: none of its")
    assert "detail" in r.json()
    app = create_app(engine, config=ServeConfig(retry_after_s=7))
    with BackgroundServer(app) as server:
        app.state.draining = True
        for path, body in (("/v1/completions", prompt), ("/v1/recommend", {"history": [1]})):
            r = post(server.url, path, body)
            assert r.status_code == 503 and r.headers["retry-after"] == "7", r.text
            assert "shutting down" in error_message(r)


def test_openai_sdk_against_a_real_server(checkpoint: Path, prompt: dict) -> None:  # noqa: F811
    """``python -m genrec serve MODEL`` (positional), driven by the ``openai`` SDK: the model
    list, completions (genrec's fields beside OpenAI's), and errors the SDK raises with
    genrec's message, its field as ``param``."""
    openai = pytest.importorskip("openai")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "genrec", "serve", str(checkpoint),
                             "--served-model-name", "tiny-rec", "--port", str(port),
                             "--threads", "1", "--volatile-catalog", "--log-level", "warning"],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: is_ready(url) or proc.poll() is not None, timeout=90)
        assert proc.poll() is None, proc.stdout.read().decode()
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny-rec"]
        done = client.completions.create(model="tiny-rec", prompt=prompt["prompt"], n=3,
                                         extra_body={"use_beam_search": True, "best_of": 4})
        assert len(done.choices) == 3 and done.model == "tiny-rec"
        assert all(c.text.startswith("<a_") for c in done.choices)
        assert len({c.model_extra["item_id"] for c in done.choices}) == 3
        with pytest.raises(openai.UnprocessableEntityError) as bad:
            client.completions.create(model="tiny-rec", prompt=[5, 6, 7],
                                      extra_body={"use_beam_search": True})
        assert bad.value.param == "prompt" and "must start with the BOS" in str(bad.value)
        with pytest.raises(openai.BadRequestError) as sampling:
            client.completions.create(model="tiny-rec", prompt=[0])
        assert sampling.value.param == "use_beam_search"
        assert "use_beam_search" in sampling.value.message
        with pytest.raises(openai.NotFoundError) as missing:
            client.completions.create(model="gpt-4", prompt=[0],
                                      extra_body={"use_beam_search": True})
        assert missing.value.param == "model" and "'gpt-4' does not exist" in str(missing.value)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
