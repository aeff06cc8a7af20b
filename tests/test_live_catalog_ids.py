"""The served catalog's item ids: updates in the table's ids <-> rows, and a real server
process whose catalog names its items ``song-00042``: requests and answers in those ids,
unknown ids skipped (history, exclude) or refused (allow, retires), new ids added by upserts
and kept in the state directory across a restart."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from genrec.catalog.id_map import IdMap
from genrec.live_catalog.ids import logged_rows, model_ids, to_rows

SERVER = Path(__file__).with_name("serving_durable_server.py")


def test_upserts_and_retires_in_rows() -> None:
    ids = IdMap.build(["a", "b", "7"])
    up = to_rows(ids, "upsert", [{"item_id": "b", "semantic_id": [1]},
                                 {"item_id": "new", "semantic_id": [2], "text": "x"},
                                 {"item_id": 7, "semantic_id": [3]},
                                 {"item_id": 8, "semantic_id": [4]}], generative=True)
    assert [it["item_id"] for it in up.data] == [1, 3, 2, 4]
    assert up.data[1] == {"item_id": 3, "semantic_id": [2], "text": "x"}
    assert up.added == ("new", "8") and len(up.ids) == 5 and len(ids) == 3
    assert to_rows(up.ids, "retire", ["8", "a"], True).data == [4, 0]
    with pytest.raises(ValueError, match=r"item_ids: unknown item ids \['zz'\]"):
        to_rows(ids, "retire", ["a", "zz"], True)
    with pytest.raises(ValueError, match=r"items\[1\].item_id: item '7' is given twice"):
        to_rows(ids, "upsert", [{"item_id": "7"}, {"item_id": 7}], False)
    with pytest.raises(ValueError, match=r"items\[0\].semantic_id: item 'q' is new"):
        to_rows(ids, "upsert", [{"item_id": "q", "text": "t"}], generative=True)
    ranker_only = to_rows(ids, "upsert", [{"item_id": "q", "text": "t"}], generative=False)
    assert ranker_only.data == [{"item_id": 3, "text": "t"}] and ranker_only.added == ("q",)


def test_a_logged_update_replays_its_ids() -> None:
    ids = IdMap.build(["a", "b"])
    again = logged_rows(ids, [{"item_id": 2}], ["c"])
    assert again.ids.rows(["c"], "h") == [2]
    with pytest.raises(ValueError, match="'b' is added again"):
        logged_rows(ids, [], ["b"])


def test_model_ids_fall_back_to_row_numbers() -> None:
    from serving_durable_server import durable_engine
    from serving_support import tiny_engine

    assert model_ids(durable_engine()).ids_of([0, 63]) == ["song-00000", "song-00063"]
    engine = tiny_engine()  # an index without ids
    assert model_ids(engine).ids_of([5]) == ["5"]
    assert len(model_ids(engine)) == engine.catalog.num_items


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    from serving_support import is_ready

    from genrec.serving.uvicorn_server import free_port

    state = tmp_path_factory.mktemp("ids") / "state"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = []

    def start() -> None:
        procs.append(subprocess.Popen([sys.executable, str(SERVER), str(state), str(port)],
                                      cwd=SERVER.parent))
        end = time.monotonic() + 120
        while not is_ready(url):
            assert procs[-1].poll() is None, "the server exited"
            assert time.monotonic() < end, "the server did not get ready"
            time.sleep(0.05)

    start()
    try:
        yield url, state, start, procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)


def free_sid() -> list[int]:
    from serving_durable_server import SIZES, durable_engine

    used = {tuple(c) for c in durable_engine().catalog.vocab.index.codes.tolist()}
    every = torch.cartesian_prod(*[torch.arange(k) for k in SIZES]).tolist()
    return next(c for c in every if tuple(c) not in used)


def test_a_server_speaks_the_tables_ids(server: tuple) -> None:
    import httpx

    url, _, start, procs = server
    with httpx.Client(base_url=url, timeout=30) as client:
        r = client.post("/v1/recommend", json={
            "history": ["song-00003", "nope", 5, "song-00010"],
            "exclude": ["song-00001", "gone"], "n": 4, "beam_width": 8})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["ignored"] == ["nope", "5", "gone"]
        assert len(got["items"]) == 4 and all(i.startswith("song-") for i in got["items"])
        assert "song-00001" not in got["items"]
        clean = client.post("/v1/recommend", json={
            "history": ["song-00003", "song-00010"], "exclude": ["song-00001"], "n": 4,
            "beam_width": 8}).json()
        assert clean["items"] == got["items"] and clean["ignored"] == []

        r = client.post("/v1/recommend", json={"history": ["x", "y"]})
        assert r.status_code == 422 and r.json()["detail"].startswith(
            "history: none of its 2 items is in the catalog"), r.text
        r = client.post("/v1/recommend", json={"history": ["song-00003"],
                                               "allow": ["song-00002", "x", "y"]})
        assert r.status_code == 422
        assert r.json()["detail"] == "allow: unknown item ids ['x', 'y']"
        from serving_durable_server import durable_engine

        prompt = durable_engine().vocab.prompt([3])  # the tokens of song-00003's Semantic ID
        choices = client.post("/v1/completions", json={"prompt": prompt, "n": 2,
                                                       "use_beam_search": True}).json()
        assert len(choices["choices"]) == 2, choices
        assert all(c["item_id"].startswith("song-") for c in choices["choices"])

        sid = free_sid()
        r = client.put("/v1/catalog/items", json={"items": [
            {"item_id": "song-new-1", "semantic_id": sid}]})
        assert r.status_code == 200, r.text
        assert r.json()["catalogs"] == {"generative": ["song-new-1"]}
        body = {"history": ["song-00003"], "allow": ["song-new-1", "song-00002"], "n": 2,
                "beam_width": 2}
        assert set(client.post("/v1/recommend", json=body).json()["items"]) == {
            "song-new-1", "song-00002"}
        r = client.put("/v1/catalog/items", json={"items": [{"item_id": "song-new-2"}]})
        assert r.status_code == 400 and "no ranker catalog" in r.json()["detail"]
        r = client.request("DELETE", "/v1/catalog/items", json={"item_ids": ["song-00002",
                                                                           "nope"]})
        assert r.status_code == 422
        assert r.json()["detail"] == "item_ids: unknown item ids ['nope']"
        r = client.request("DELETE", "/v1/catalog/items", json={"item_ids": ["song-00002"]})
        assert r.status_code == 200 and r.json()["catalogs"] == {"generative": ["song-00002"]}
        version = r.json()["catalog_version"]
        assert client.post("/v1/recommend", json=body).json()["items"] == ["song-new-1"]

    procs[-1].terminate()  # a restart replays the state directory, the new id with it
    procs[-1].wait(30)
    start()
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/ready").json()["catalog_version"] == version
        assert client.post("/v1/recommend", json=body).json()["items"] == ["song-new-1"]
