"""``load_app``: the app of an :class:`AppSpec` answers like the offline engine over the saved
model (its batches run here, or in an engine process), ``device`` replaces the spec's, a
catalog state directory is replayed on loading, and with an engine process only the child
logs a catalog update (the local worker mirrors it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from serving_support import RECOMMEND, offline

from genrec import Engine
from genrec.live_catalog.stored import read_state
from genrec.serving import ServeConfig, Worker
from genrec.serving.app_loader import load_app
from genrec.serving.engine_process import EngineProcess
from genrec.serving.spec import AppSpec


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Engine:
    return Engine.from_pretrained(checkpoint)


def assert_answers_like(client: TestClient, reference: Engine) -> None:
    for body in RECOMMEND:
        r = client.post("/v1/recommend", json=body)
        assert r.status_code == 200, r.text
        items, scores = offline(reference, body)
        assert r.json()["items"] == items
        assert torch.allclose(torch.tensor(r.json()["scores"]), torch.tensor(scores), atol=1e-5)


def test_the_app_of_a_saved_model_answers_like_the_offline_engine(checkpoint: Path,
                                                                  reference: Engine) -> None:
    app = load_app(AppSpec.of(checkpoint, threads=1, config=ServeConfig(max_wait_ms=1)))
    assert type(app.state.worker) is Worker  # batches run in this process
    with TestClient(app) as client:
        assert_answers_like(client, reference)
        assert client.get("/ready").json() == {"status": "ready", "catalog_version": 0}


def test_device_replaces_the_specs(checkpoint: Path) -> None:
    spec = AppSpec.of(checkpoint, threads=1, device="no-such-device")
    with pytest.raises(RuntimeError, match="no-such-device"):
        load_app(spec)
    app = load_app(spec, device="cpu")
    with TestClient(app) as client:
        assert client.post("/v1/recommend", json=RECOMMEND[0]).status_code == 200


def test_a_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises((OSError, ValueError), match=str(tmp_path / "nothing")):
        load_app(AppSpec.of(tmp_path / "nothing"))


def test_a_catalog_state_dir_is_replayed_on_loading(checkpoint: Path, tmp_path: Path) -> None:
    spec = AppSpec.of(checkpoint, threads=1,
                      config=ServeConfig(max_wait_ms=1, catalog_state=str(tmp_path / "state")))
    with TestClient(load_app(spec)) as client:
        r = client.request("DELETE", "/v1/catalog/items", json={"item_ids": [3, 17]})
        assert r.status_code == 200 and r.json()["catalog_version"] == 1, r.text
    with TestClient(load_app(spec)) as client:  # a restart
        assert client.get("/ready").json()["catalog_version"] == 1
        r = client.post("/v1/recommend", json={"history": [1], "allow": [3, 17, 20], "n": 3,
                                                "beam_width": 3})
        assert r.status_code == 200 and r.json()["items"] == ["20"], r.text


def test_with_an_engine_process_only_the_child_logs(checkpoint: Path, tmp_path: Path,
                                                    reference: Engine) -> None:
    state = tmp_path / "state"
    spec = AppSpec.of(checkpoint, threads=1, config=ServeConfig(
        max_wait_ms=1, engine_process=True, catalog_state=str(state)))
    app = load_app(spec)
    child = app.state.worker
    assert isinstance(child, EngineProcess) and child.alive
    with TestClient(app) as client:
        assert_answers_like(client, reference)
        r = client.request("DELETE", "/v1/catalog/items", json={"item_ids": [5]})
        assert r.status_code == 200 and r.json()["catalog_version"] == 1, r.text
        assert client.get("/ready").json()["catalog_version"] == 1
    assert not child.alive  # stopped with the app
    assert [(r.version, r.op, r.data) for r in read_state(state).records] == [
        (1, "retire", [5])]
