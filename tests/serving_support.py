"""Shared by the serving tests: a tiny generative engine with an item table, a ranker on a
real engine, test doubles, and small HTTP helpers. (Not a test module.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import torch

from genrec import BeamParams, Engine, EngineConfig, ScoreParams, ScoreRequest
from genrec.catalog.item_table import ItemTable
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.model import ModelConfig, build_model
from genrec.serving import BackgroundServer, RowRankRequest, ServeConfig, create_app
from genrec.serving.openai_api import is_openai_route
from genrec.vocab.sid_vocab import BOS_ID, NUM_SPECIAL, SOFT_ID, SidVocab

SIZES = [5, 4, 3]
N_ITEMS = 40
LABEL = 3


def tiny_engine(seed: int = 0, user_dim: int = 5, **config: object) -> Engine:
    """A random generative model over 40 items (3-level Semantic IDs), ``user_dim`` 5, and an
    item table (2 vectors per item, version 3); ``seed`` draws the weights only (the catalog
    and the table are the same for every seed); ``config``: more ``EngineConfig`` fields."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(0)
    all_ids = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    index = SemanticIndex(all_ids[torch.randperm(all_ids.shape[0], generator=g)[:N_ITEMS]], SIZES)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, user_dim=user_dim, max_position_embeddings=64)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID, **config),
                    vocab=SidVocab(index, max_history=6))
    engine.set_item_table(ItemTable(torch.randn(N_ITEMS, 2, 32, generator=g), version=3))
    return engine


class EngineRanker:
    """The ranker protocol on a real engine: prefix = BOS [soft] + the history's virtual item
    tokens, each candidate its item's virtual tokens, score = log p(LABEL) at its end."""

    def __init__(self, engine: Engine, gate: threading.Event | None = None) -> None:
        self.engine, self.gate = engine, gate
        self.entered = threading.Event()

    @property
    def catalog_version(self) -> int:
        return self.engine.item_table.version

    def rank_rows(self, requests: Sequence[RowRankRequest]) -> list[torch.Tensor]:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        engine, reqs = self.engine, []
        for r, q in enumerate(requests):
            for name in ("history", "candidates"):
                bad = [i for i in getattr(q, name) if not 0 <= i < N_ITEMS]
                if bad:
                    raise ValueError(f"requests[{r}].{name}: unknown item id {bad[0]}")
            soft = [SOFT_ID] if q.user_vector is not None else []
            prefix = [BOS_ID, *soft, *engine.item_tokens(q.history)]
            reqs.append(ScoreRequest(prefix, [engine.item_tokens([c]) for c in q.candidates],
                                     q.user_vector))
        out = engine.score_requests(reqs, ScoreParams(mode="labels", label_token_ids=[LABEL]))
        return [s[:, 0] for s in out]


class Updater:
    """A catalog updater double: records calls, bumps the version."""

    def __init__(self) -> None:
        self.version, self.calls = 10, []

    def upsert(self, items: list[dict], ids: object = None) -> int:
        if any(it["item_id"] > 1000 for it in items):
            raise ValueError("items: item ids above 1000 are refused")
        self.calls.append(("upsert", items))
        self.version += 1
        return self.version

    def retire(self, item_ids: list[int], ids: object = None) -> int:
        self.calls.append(("retire", item_ids))
        self.version += 1
        return self.version


class CharTokenizer:
    """Text -> token ids (one per character, within the text vocabulary)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS_ID] if add_special_tokens else []) + [3 + ord(c) % 9 for c in text]


def post(url: str, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30, **kw)


def error_message(r: httpx.Response) -> str:
    """The message of an error answer, checking its shape: OpenAI's ``{"error": {"message",
    "type", "param", "code"}}`` on the OpenAI-style routes, ``{"detail": str}`` elsewhere."""
    body = r.json()
    if is_openai_route(r.request.url.path):
        assert set(body) == {"error"}, body
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}, body
        assert error["code"] == r.status_code and isinstance(error["message"], str), body
        return error["message"]
    assert isinstance(body.get("detail"), str), body
    return body["detail"]


RECOMMEND = [
    {"history": [3, 17, 8]},
    {"history": [1], "user_vector": [0.5, -0.2, 0.1, 0.0, 1.0], "n": 4, "beam_width": 8},
    {"history": [5, 6, 7, 8, 9, 10, 11, 12], "exclude": [0, 1, 2]},
    {"history": [20], "allow": [4, 9, 30, 31], "n": 3, "beam_width": 6},
    {"history": [], "user_vector": [1.0] * 5, "n": 2, "beam_width": 2},
]


def rows(ids: list | None) -> list[int] | None:
    """The rows of a test catalog's ids (its index names no ids: row i is ``"i"``)."""
    return None if ids is None else [int(i) for i in ids]


def offline(engine: Engine, body: dict) -> tuple[list[str], list[float]]:
    """The items (ids) and scores the engine gives for a ``/v1/recommend`` body."""
    req = RowRequest(rows(body["history"]), body.get("user_vector"),
                           rows(body.get("exclude")), rows(body.get("allow")))
    rec = engine.recommend_rows([req], BeamParams(body.get("beam_width", 20), body.get("n", 10)))[0]
    return [str(i) for i in rec.items], rec.scores


def wait_until(cond: Callable[[], bool], timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def is_ready(url: str) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# Fixtures shared by the serving test modules (import them by name there).

@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine()

@pytest.fixture(scope="module")
def full(engine: Engine) -> Iterator[tuple[str, Updater]]:
    updater = Updater()
    app = create_app(engine, ranker=EngineRanker(engine), catalog_updater=updater,
                     tokenizer=CharTokenizer(), config=ServeConfig(max_wait_ms=20))
    with BackgroundServer(app) as server:
        yield server.url, updater


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny generative model saved as a checkpoint folder (with its vocabulary)."""
    from genrec.model import save_model

    path = tmp_path_factory.mktemp("generative")
    engine = tiny_engine()
    save_model(engine.model, path)
    engine.vocab.save(path)
    return path


@pytest.fixture(scope="module")
def bare(engine: Engine) -> Iterator[str]:
    with BackgroundServer(create_app(engine)) as server:
        yield server.url
