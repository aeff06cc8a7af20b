"""The HTTP server, served by uvicorn on loopback and called over httpx: every endpoint
answers like the offline engine, concurrent requests included."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import torch
from serving_support import (
    RECOMMEND,
    CharTokenizer,
    EngineRanker,
    Updater,
    offline,
    post,
    rows,
)

from genrec import Engine, ScoreParams
from genrec.serving import RowRankRequest


def test_concurrent_recommend_equals_offline_engine(full: tuple[str, Updater],
                                                    engine: Engine) -> None:
    url, _ = full
    bodies = RECOMMEND * 3
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: post(url, "/v1/recommend", b), bodies))
    for body, r in zip(bodies, answers, strict=True):
        assert r.status_code == 200, r.text
        items, scores = offline(engine, body)
        assert r.json()["items"] == items and r.json()["catalog_version"] == 3
        assert torch.allclose(torch.tensor(r.json()["scores"]), torch.tensor(scores), atol=1e-4)
    batches = httpx.get(url + "/metrics").text
    count = [ln for ln in batches.splitlines()
             if ln.startswith('genrec_batch_size_count{kind="recommend"}')]
    assert float(count[0].split()[-1]) < len(bodies) + 2  # concurrent requests were merged


def test_rank_equals_the_ranker_offline_and_rerank_uses_it(full: tuple[str, Updater],
                                                           engine: Engine) -> None:
    url, _ = full
    ranker = EngineRanker(engine)
    bodies = [{"history": [1, 2, 3], "candidates": [4, 5, 6, 39]},
              {"history": [], "candidates": [7], "user_vector": [0.1] * 5}]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: post(url, "/v1/rank", b), bodies * 2))
    for body, r in zip(bodies * 2, answers, strict=True):
        assert r.status_code == 200, r.text
        want = ranker.rank_rows([RowRankRequest(body["history"], body["candidates"],
                                        body.get("user_vector"))])[0]
        assert torch.allclose(torch.tensor(r.json()["scores"]), want, atol=1e-5)
    body = {"history": [3, 17, 8], "n": 3, "beam_width": 6, "rerank": True}
    got = post(url, "/v1/recommend", body).json()
    retrieved, _ = offline(engine, {**body, "n": 6})
    scores = ranker.rank_rows([RowRankRequest(body["history"], rows(retrieved))])[0]
    order = torch.argsort(scores, descending=True, stable=True)[:3].tolist()
    assert got["items"] == [retrieved[i] for i in order]


def test_score_token_ids_match_the_engine(full: tuple[str, Updater], engine: Engine) -> None:
    url, _ = full
    query, items, labels = [0, 3, 4, 5], [[6, 7], [8], [9, 10, 11]], [3, 4]
    r = post(url, "/v1/score", {"query": query, "items": items, "label_token_ids": labels})
    assert r.status_code == 200, r.text
    params = ScoreParams(mode="labels", label_token_ids=labels)
    want = engine.score(query, items, params).exp()
    assert torch.allclose(torch.tensor(r.json()["scores"]), want, atol=1e-5)
    assert r.json()["meta_info"]["shared_prefix"] is True
    soft = post(url, "/v1/score", {"query": query, "items": items, "label_token_ids": labels,
                                    "apply_softmax": True}).json()["scores"]
    assert torch.allclose(torch.tensor(soft).sum(-1), torch.ones(3), atol=1e-5)
    first = post(url, "/v1/score", {"query": query, "items": items, "label_token_ids": labels,
                                     "item_first": True}).json()
    for item, row in zip(items, first["scores"], strict=True):
        seq = item + query
        alone = engine.score(seq[:-1], [seq[-1:]], params).exp()[0]
        assert torch.allclose(torch.tensor(row), alone, atol=1e-5)
    empty = post(url, "/v1/score", {"query": query, "items": [], "label_token_ids": labels})
    assert empty.json()["scores"] == []
    prompts = [[5], [6, 7]]  # no query: each item is a whole prompt (SGLang's score_prompts)
    alone = post(url, "/v1/score", {"items": prompts, "label_token_ids": labels}).json()
    for seq, row in zip(prompts, alone["scores"], strict=True):
        want = engine.score(seq[:-1], [seq[-1:]], params).exp()[0]
        assert torch.allclose(torch.tensor(row), want, atol=1e-5)


def test_score_text_needs_a_tokenizer(full: tuple[str, Updater], bare: str,
                                      engine: Engine) -> None:
    url, _ = full
    body = {"query": "ab", "items": ["c", "de"], "label_token_ids": [3]}
    r = post(url, "/v1/score", body)
    assert r.status_code == 200, r.text
    tok = CharTokenizer()
    want = engine.score(tok.encode("ab"), [tok.encode(t, False) for t in ("c", "de")],
                        ScoreParams(mode="labels", label_token_ids=[3])).exp()
    assert torch.allclose(torch.tensor(r.json()["scores"]), want, atol=1e-5)
    r = post(bare, "/v1/score", body)
    assert r.status_code == 400 and r.json()["detail"].startswith("query:")
    r = post(bare, "/v1/score", {"query": [1], "items": ["x"], "label_token_ids": [3]})
    assert r.status_code == 400 and r.json()["detail"].startswith("items[0]:")


def test_completions_beam_search(full: tuple[str, Updater], engine: Engine) -> None:
    url, _ = full
    vocab = engine.vocab
    history = [3, 17, 8]
    prompt = vocab.prompt(history)
    r = post(url, "/v1/completions", {"prompt": prompt, "use_beam_search": True, "n": 3,
                                       "best_of": 6, "max_tokens": 3})
    assert r.status_code == 200, r.text
    items, scores = offline(engine, {"history": history, "n": 3, "beam_width": 6})
    choices = r.json()["choices"]
    assert [c["item_id"] for c in choices] == items
    assert torch.allclose(torch.tensor([c["score"] for c in choices]), torch.tensor(scores),
                          atol=1e-4)
    text = " ".join(c["text"] for c in (choices[0], choices[1]))  # two items as a text prompt
    again = post(url, "/v1/completions", {"prompt": text, "use_beam_search": True}).json()
    assert again["choices"][0]["item_id"] == offline(engine, {"history": items[:2], "n": 1,
                                                               "beam_width": 1})[0][0]
    user = [0.3] * 5
    soft = post(url, "/v1/completions", {"prompt": vocab.prompt(history, soft_token=True),
                                          "user_vector": user, "use_beam_search": True, "n": 2})
    assert [c["item_id"] for c in soft.json()["choices"]] == offline(
        engine, {"history": history, "user_vector": user, "n": 2, "beam_width": 2})[0]
    r = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 3})
    assert r.status_code == 400 and "use_beam_search" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "use_beam_search"


def test_catalog_hooks(full: tuple[str, Updater], bare: str) -> None:
    url, updater = full
    r = httpx.put(url + "/v1/catalog/items", json={"items": [{"item_id": 4, "text": "lamp"}]})
    assert r.status_code == 200 and r.json() == {"catalog_version": 11, "count": 1,
                                                 "catalogs": {"ranker": ["4"]}}
    r = httpx.request("DELETE", url + "/v1/catalog/items", json={"item_ids": [4, 5]})
    assert r.json() == {"catalog_version": 12, "count": 2,
                        "catalogs": {"generative": ["4", "5"], "ranker": ["4", "5"]}}
    assert updater.calls == [("upsert", [{"item_id": 4, "text": "lamp"}]),
                             ("retire", [4, 5])]
    r = httpx.put(url + "/v1/catalog/items", json={"items": [{"item_id": 5000}]})
    assert r.status_code == 422 and r.json()["detail"].startswith("items")
    r = httpx.put(bare + "/v1/catalog/items", json={"items": [{"item_id": 4}]})
    assert r.status_code == 400 and r.json()["detail"].startswith("items[0]: no ranker catalog")


def test_overlap_scheduling_answers_like_the_offline_engine(engine: Engine) -> None:
    # --overlap on the CPU: batch k+1 packed while batch k runs; answers unchanged, a bad
    # request still fails alone
    from genrec.serving import BackgroundServer, ServeConfig, create_app

    app = create_app(engine, catalog_updater=Updater(),
                     config=ServeConfig(max_wait_ms=10, overlap=True))
    assert app.state.scheduler.stages is not None
    with BackgroundServer(app) as server:
        url = server.url
        bodies = RECOMMEND * 3 + [{"history": [999]}]
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda b: post(url, "/v1/recommend", b), bodies))
        for body, r in zip(bodies[:-1], answers, strict=False):
            assert r.status_code == 200, r.text
            assert r.json()["items"] == offline(engine, body)[0]
        assert answers[-1].status_code == 422 and "history" in answers[-1].json()["detail"]
        query, items, labels = [0, 3, 4, 5], [[6, 7], [8]], [3, 4]
        r = post(url, "/v1/score", {"query": query, "items": items, "label_token_ids": labels})
        want = engine.score(query, items, ScoreParams(mode="labels", label_token_ids=labels))
        assert torch.allclose(torch.tensor(r.json()["scores"]), want.exp(), atol=1e-5)
