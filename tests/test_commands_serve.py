"""``genrec serve`` as an operator runs it, in real processes on loopback: API keys (from the
environment and the command line), the bind check, and live catalog updates that survive a
``kill -9`` and a restart (with and without ``--engine-process``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serving_support import N_ITEMS, RECOMMEND, is_ready, post, wait_until

from genrec import Engine
from genrec.catalog import SemanticIndex
from genrec.model import save_model
from genrec.serving.uvicorn_server import free_port


def start(model: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """``genrec serve --model MODEL ARGS`` on a free loopback port, once ready."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "genrec.cli", "serve", "--model", str(model),
                             "--port", str(port), "--threads", "1", *args],
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: is_ready(url) or proc.poll() is not None, timeout=90)
    assert proc.poll() is None, proc.stdout.read().decode()
    return proc, url


def saved(engine: Engine, folder: Path) -> Path:
    save_model(engine.model, folder)
    engine.vocab.save(folder)
    return folder


def test_genrec_serve_with_keys(tmp_path, engine: Engine) -> None:  # noqa: ANN001
    """A real ``genrec serve`` with an api key from the environment and an admin key: /v1
    needs the api key (401 without: counted in the metrics), catalog updates the admin key,
    the probes stay open, and neither key appears in the server's output."""
    api, admin = "k-api-7f3a", "k-admin-91c2"
    proc, url = start(saved(engine, tmp_path), "--admin-key", admin, "--log-level", "info",
                      env={"GENREC_API_KEY": api})
    bearer = lambda key: {"Authorization": f"Bearer {key}"}  # noqa: E731
    try:
        assert post(url, "/v1/recommend", RECOMMEND[0]).status_code == 401
        assert post(url, "/v1/recommend", RECOMMEND[0], headers=bearer(admin)).status_code == 200
        answer = post(url, "/v1/recommend", RECOMMEND[0], headers=bearer(api))
        assert answer.status_code == 200, answer.text
        retire = {"item_ids": [0]}
        refused = httpx.request("DELETE", url + "/v1/catalog/items", json=retire,
                                headers=bearer(api))
        assert refused.status_code == 401 and api not in refused.text
        done = httpx.request("DELETE", url + "/v1/catalog/items", json=retire,
                             headers=bearer(admin))
        assert done.status_code == 200, done.text
        metrics = httpx.get(url + "/metrics")
        assert metrics.status_code == 200 and 'status="401"' in metrics.text
        assert httpx.get(url + "/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert api not in out and admin not in out


def test_genrec_serve_refuses_an_open_address_without_keys(tmp_path) -> None:  # noqa: ANN001
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENREC_")}
    run = subprocess.run([sys.executable, "-m", "genrec.cli", "serve", "--model", str(tmp_path),
                          "--host", "0.0.0.0"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert "without an API key" in run.stderr and "--allow-insecure" in run.stderr


def live_items(url: str) -> list[int]:
    """Every item the served catalog can return (a beam as wide as the catalog)."""
    body = {**RECOMMEND[0], "beam_width": N_ITEMS, "n": N_ITEMS}
    answer = post(url, "/v1/recommend", body)
    assert answer.status_code == 200, answer.text
    return sorted(answer.json()["items"])


@pytest.mark.skipif(os.name != "posix", reason="kills the server with SIGKILL")
@pytest.mark.parametrize("engine_process", [False, True], ids=["one-process", "engine-process"])
def test_acknowledged_updates_survive_kill_and_restart(tmp_path, engine: Engine,  # noqa: ANN001
                                                       engine_process: bool) -> None:
    model = saved(engine, tmp_path / "model")
    args = ["--engine-process"] if engine_process else []
    proc, url = start(model, *args)
    try:
        before = live_items(url)
        gone = httpx.request("DELETE", url + "/v1/catalog/items", json={"item_ids": before[:3]})
        assert gone.status_code == 200, gone.text
        version = gone.json()["catalog_version"]
    finally:
        proc.kill()  # SIGKILL: no shutdown hook runs
        proc.wait(30)
    assert (model / "catalog-state").is_dir()
    proc, url = start(model, *args)
    try:
        assert httpx.get(url + "/ready").json()["catalog_version"] == version
        assert live_items(url) == before[3:]
    finally:
        proc.kill()
        proc.wait(30)
    # --volatile-catalog: the same start, updates in memory only (and the log left alone)
    proc, url = start(model, "--volatile-catalog", *args)
    try:
        assert live_items(url) == before
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs a directory the user cannot write (root writes everywhere)")
def test_a_read_only_model_needs_a_catalog_state_dir(tmp_path, engine: Engine) -> None:  # noqa: ANN001
    model = saved(engine, tmp_path / "model")
    model.chmod(0o555)
    try:
        run = subprocess.run([sys.executable, "-m", "genrec.cli", "serve", "--model", str(model)],
                             capture_output=True, text=True, timeout=120)
    finally:
        model.chmod(0o755)
    assert run.returncode == 2 and "--catalog-state DIR" in run.stderr


def test_catalog_state_dir_defaults_to_the_model_and_refuses_a_read_only_one(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from genrec.commands.serve import catalog_state_dir

    assert catalog_state_dir(tmp_path, None, False) == str(tmp_path / "catalog-state")
    assert catalog_state_dir(tmp_path, tmp_path / "x", False) == str(tmp_path / "x")
    assert catalog_state_dir(tmp_path, None, True) is None
    monkeypatch.setattr(os, "access", lambda *_: False)  # a checkpoint the server cannot write
    with pytest.raises(ValueError, match="--catalog-state DIR"):
        catalog_state_dir(tmp_path, None, False)
    assert catalog_state_dir(tmp_path, tmp_path / "x", False) == str(tmp_path / "x")


def test_new_items_get_their_semantic_id_from_the_saved_codebooks(tmp_path) -> None:  # noqa: ANN001
    """A model over an index built from embeddings: ``PUT /v1/catalog/items`` with an
    ``embedding`` and no ``semantic_id`` gets the ID the codebooks give (in the answer), the
    item is recommendable at once, and the logged update brings it back after a kill -9."""
    import torch

    from genrec.catalog import build_semantic_index
    from genrec.catalog.assign import IdAssigner
    from genrec.model import ModelConfig, build_model
    from genrec.vocab.sid_vocab import NUM_SPECIAL, SidVocab

    emb = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    index = build_semantic_index(emb, levels=2, codebook_size=4, iters=20,
                                 item_ids=[f"song-{k}" for k in range(40)])
    torch.manual_seed(0)
    model = build_model(ModelConfig(
        vocab_size=NUM_SPECIAL + index.vocab_size, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=64))
    folder = tmp_path / "model"
    save_model(model, folder)
    SidVocab(index, max_history=6).save(folder)
    new = (emb[7] + 0.05).tolist()
    (want,) = IdAssigner.of(index).assign(torch.tensor([new]), index.codes_to_items)
    body = {"history": ["song-3"], "allow": ["song-new"], "n": 1, "beam_width": 1}
    proc, url = start(folder)
    try:
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": "song-new", "embedding": new}]})
        assert r.status_code == 200, r.text
        assert r.json()["semantic_ids"] == {"song-new": want}
        assert r.json()["catalogs"] == {"generative": ["song-new"]}
        assert post(url, "/v1/recommend", body).json()["items"] == ["song-new"]
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": "x", "embedding": [0.5] * 3}]})
        assert r.status_code == 422
        assert r.json()["detail"] == "items[0].embedding: expected 8 values, got 3"
        r = httpx.put(url + "/v1/catalog/items", json={"items": [{"item_id": "x", "text": "a"}]})
        assert r.status_code == 422 and r.json()["detail"].startswith(
            "items[0].text: this index was built from embeddings")
    finally:
        proc.kill()
        proc.wait(30)
    proc, url = start(folder)
    try:
        assert post(url, "/v1/recommend", body).json()["items"] == ["song-new"]
    finally:
        proc.kill()
        proc.wait(30)
    # an index without codebooks (a ready-made Semantic-ID file): the caller sends the ID
    bare = tmp_path / "bare"
    save_model(model, bare)
    SidVocab(SemanticIndex(index.codes, index.codebook_sizes, index.item_ids),
             max_history=6).save(bare)
    proc, url = start(bare)
    try:
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": "song-new", "embedding": new}]})
        assert r.status_code == 422 and r.json()["detail"].startswith(
            "items[0].semantic_id: required")
    finally:
        proc.kill()
        proc.wait(30)
