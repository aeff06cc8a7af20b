"""Scoring grids: equal to the packed path, batch-independent, bucketed with padding, buffers
reused across calls, nothing read back by the host inside the grid's forward."""

from __future__ import annotations

import pytest
import torch

from genrec import Engine, EngineConfig, ScoreParams, ScoreRequest
from genrec.catalog.item_table import ItemTable
from genrec.engine import score_runner
from genrec.model import ModelConfig, build_model

VOCAB, HIDDEN, ITEMS = 50, 32, 30
LABELS = ScoreParams(mode="labels", label_token_ids=[3, 4])
READOUTS = [LABELS, ScoreParams(mode="labels", label_token_ids=[3, 4], apply_softmax=True),
            ScoreParams(mode="head")]


@pytest.fixture(scope="module")
def parts() -> tuple[torch.nn.Module, ItemTable]:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, score_head=True, max_position_embeddings=256)
    return build_model(cfg).eval(), ItemTable(0.5 * torch.randn(ITEMS, 2, HIDDEN))


def _engine(parts: tuple, **config: object) -> Engine:
    model, table = parts
    return Engine(model, item_table=table, config=EngineConfig(**config))


def _item(i: int) -> list[int]:
    return [VOCAB + 2 * i, VOCAB + 2 * i + 1]


def _requests(seed: int = 1, shapes: tuple = ((5, 7), (12, 3), (1, 20))) -> list[ScoreRequest]:
    g = torch.Generator().manual_seed(seed)

    def items(n: int) -> list[int]:
        return torch.randint(0, ITEMS, (n,), generator=g).tolist()

    return [ScoreRequest([0] + [t for i in items(n) for t in _item(i)],
                         [_item(i) for i in items(c)]) for n, c in shapes]


@pytest.mark.parametrize("params", READOUTS, ids=["labels", "softmax", "head"])
def test_grid_equals_the_packed_path(parts: tuple, attention_path: str,
                                     params: ScoreParams) -> None:
    packed = _engine(parts, score_runners=False).score_requests(_requests(), params)
    engine = _engine(parts, score_runners=True)
    grid = engine.score_requests(_requests(), params)
    assert len(engine.scorers.kept_runners()) == 1
    for a, b in zip(grid, packed, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, atol=2e-6)


def test_a_candidate_scores_the_same_alone_or_among_many(parts: tuple) -> None:
    engine = _engine(parts, score_runners=True)
    [many] = engine.score_requests(_requests(shapes=((6, 300),)), LABELS)
    request = _requests(shapes=((6, 300),))[0]
    for c in (0, 17, 299):
        [alone] = engine.score_requests([ScoreRequest(request.prefix,
                                                      [request.candidates[c]])], LABELS)
        assert torch.allclose(alone[0], many[c], atol=1e-6)


def test_request_buckets_pad_without_changing_scores(parts: tuple) -> None:
    exact = _engine(parts, score_runners=True)
    padded = _engine(parts, score_runners=True, search_request_buckets=(2, 8))
    for n in (1, 3):
        want = exact.score_requests(_requests()[:n], LABELS)
        got = padded.score_requests(_requests()[:n], LABELS)
        for a, b in zip(got, want, strict=True):
            assert torch.allclose(a, b, atol=1e-6)
    assert sorted(k.requests for k in padded.scorers.kept_runners()) == [2, 8]
    assert {k.width for k in padded.scorers.kept_runners()} == {8, 32}  # 7 -> 8, 20 -> 32


def test_buffers_are_reused_and_bounded(parts: tuple) -> None:
    engine = _engine(parts, score_runners=True, max_search_runners=2)
    engine.score_requests(_requests(), LABELS)
    [runner] = engine.scorers.kept_runners().values()
    pointer = runner.embeds.data_ptr()
    engine.score_requests(_requests(seed=5), LABELS)  # other requests of the same grid
    assert list(engine.scorers.kept_runners().values()) == [runner]
    assert runner.embeds.data_ptr() == pointer
    for params in READOUTS[1:]:
        engine.score_requests(_requests(), params)
    kept = engine.scorers.kept_runners()
    assert len(kept) == 2 and runner not in kept.values()


def test_other_batches_take_the_packed_path(parts: tuple,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(parts, score_runners=True)
    mixed = [ScoreRequest([0, 5], [_item(1), _item(2) + [7]])]  # candidates of two lengths
    loglik = [ScoreRequest([0, 5], [[6, 7], [8, 9]])]
    want = _engine(parts, score_runners=False)
    assert torch.allclose(engine.score_requests(mixed, LABELS)[0],
                          want.score_requests(mixed, LABELS)[0])
    assert torch.allclose(engine.score_requests(loglik, ScoreParams(mode="loglik"))[0],
                          want.score_requests(loglik, ScoreParams(mode="loglik"))[0])
    monkeypatch.setattr(score_runner, "MAX_GRID_TOKENS", 16)  # above the largest grid
    engine.score_requests(_requests(), LABELS)
    assert not engine.scorers.kept_runners()
    assert not _engine(parts).scorers.enabled  # default: CUDA only


def test_grid_forward_reads_nothing_back(parts: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from genrec.model import attention
    from genrec.utils.sync_trap import no_host_sync

    monkeypatch.setattr(attention, "cascade_attention_op", lambda: None)  # the GPU's path
    engine = _engine(parts, score_runners=True)
    want = engine.score_requests(_requests(), LABELS)
    batch = engine.prepare_score(_requests(), LABELS).batches[0]
    key = engine.scorers.key(batch, LABELS)
    runner = engine.scorers.kept_runners()[key]
    with torch.inference_mode():  # as Engine.run_score runs it
        cands = runner.load(batch, engine.embed(batch))
        with no_host_sync():
            scores = runner.run()[cands]
    assert torch.allclose(scores, torch.cat(want), atol=1e-6)
