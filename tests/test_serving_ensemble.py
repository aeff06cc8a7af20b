"""Serving an ensemble (``genrec serve --ensemble``): ``/v1/recommend`` answers as the offline
:class:`~genrec.engine.ensemble.Ensemble`, in the engine's own process too, and every member
reads the served catalog after live updates; members that cannot be ensembled are refused at
load time, naming the option."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from logged_catalog_support import free_sids
from serving_support import N_ITEMS, post, tiny_engine

from genrec import BeamParams, Engine
from genrec.engine import RowRequest
from genrec.engine.ensemble import Ensemble
from genrec.model import save_model

BODIES = [{"history": [3, 17, 8], "n": 5, "beam_width": 8},
          {"history": [5, 6], "exclude": [0, 1, 2], "n": 4, "beam_width": 6},
          {"history": [20, N_ITEMS], "allow": [4, 9, 30, 31, N_ITEMS], "n": 3, "beam_width": 6}]


def _checkpoint(path: Path, seed: int, user_dim: int = 0) -> Path:
    engine = tiny_engine(seed=seed, user_dim=user_dim)
    save_model(engine.model, path)
    engine.vocab.save(path)
    return path


def _offline(ensemble: Ensemble, body: dict, catalog) -> tuple[list[int], list[float]]:
    request = RowRequest(body["history"], exclude=body.get("exclude"),
                               allow=body.get("allow"))
    rec = ensemble.recommend_rows([request], BeamParams(body["beam_width"], body["n"]),
                             catalog=catalog)[0]
    return [str(i) for i in rec.items], rec.scores  # the test catalog names rows by number


@pytest.mark.parametrize("engine_process", [False, True])
def test_recommend_is_the_offline_ensemble_across_catalog_updates(
        tmp_path: Path, engine_process: bool) -> None:
    import httpx

    from genrec.serving import BackgroundServer, ServeConfig
    from genrec.serving.app_loader import load_app
    from genrec.serving.spec import AppSpec

    paths = [_checkpoint(tmp_path / f"m{seed}", seed) for seed in (1, 2, 3)]
    spec = AppSpec.of(paths[0], ensemble=tuple(paths[1:]), threads=1, config=ServeConfig(
        max_wait_ms=1, engine_process=engine_process))
    ensemble = Ensemble([Engine.from_pretrained(p) for p in paths])
    sids = free_sids(ensemble.engines[0], 1)
    with BackgroundServer(load_app(spec)) as server:
        url = server.url
        r = httpx.put(url + "/v1/catalog/items",
                      json={"items": [{"item_id": N_ITEMS, "semantic_id": sids[0]}]})
        assert r.status_code == 200, r.text
        first = post(url, "/v1/recommend", {"history": [3, 17, 8]}).json()["items"]
        r = httpx.request("DELETE", url + "/v1/catalog/items", json={"item_ids": [first[0]]})
        assert r.status_code == 200, r.text
        state = ensemble.engines[0].catalog.updated([(N_ITEMS, sids[0])]).updated(
            retire=[int(first[0])])
        for body in BODIES:
            got = post(url, "/v1/recommend", body).json()
            items, scores = _offline(ensemble, body, state)
            assert got["items"] == items and first[0] not in items
            assert torch.allclose(torch.tensor(got["scores"]), torch.tensor(scores), atol=1e-4)
            assert got["catalog_version"] == 2
        # not the first member's own answer (the ensemble's pool is ranked by the mean)
        own = ensemble.engines[0].recommend_rows(
            [RowRequest(b["history"], exclude=b.get("exclude"), allow=b.get("allow"))
             for b in BODIES], BeamParams(6, 3), catalog=state)
        assert any(post(url, "/v1/recommend", {**b, "n": 3, "beam_width": 6}).json()["scores"]
                   != pytest.approx(o.scores, abs=1e-4) for b, o in zip(BODIES, own, strict=True))


def test_members_that_cannot_be_ensembled_are_refused(tmp_path: Path) -> None:
    from genrec.serving.app_loader import load_app
    from genrec.serving.spec import AppSpec

    plain = _checkpoint(tmp_path / "plain", 1)
    soft = _checkpoint(tmp_path / "soft", 2, user_dim=5)
    with pytest.raises(ValueError, match=r"--ensemble: .*soft token"):
        load_app(AppSpec.of(plain, ensemble=(soft,), threads=1))
    with pytest.raises(ValueError, match=r"--ensemble .*missing"):
        AppSpec.of(plain, ensemble=(tmp_path / "missing",)).check()


def test_preparing_a_batch_waits_for_every_members_graph_capture() -> None:
    """A member capturing a CUDA graph holds its engine's capture lock; the worker's host step
    (packing the next batch, with device copies) must wait for it, whichever member it is."""
    import threading

    from genrec.serving.messages import RecommendBatch
    from genrec.serving.worker import Worker

    members = [tiny_engine(seed=s, user_dim=0) for s in (1, 2)]
    worker = Worker(members[0], ensemble=Ensemble(members))
    done = threading.Event()

    def prepare() -> None:
        worker.prepare(RecommendBatch(6, 3), [RowRequest([3, 17])])
        done.set()

    lock = members[1].searches.capture_lock
    with lock:  # as BeamRunner does while it captures
        thread = threading.Thread(target=prepare)
        thread.start()
        assert not done.wait(0.3)  # held back by the second member's capture
    thread.join(10)
    assert done.is_set()
    with pytest.raises(ValueError, match="first member"):
        Worker(members[1], ensemble=Ensemble(members))
