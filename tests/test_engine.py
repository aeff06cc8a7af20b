"""Engine: a scoring engine that also holds a Semantic-ID catalog: loading one with its
vocabulary and item weight, installing vocabularies, refusing what the model cannot serve."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genrec import BeamParams, Engine, EngineConfig, RecommendRequest, ScoreParams
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine.params import save_item_weight
from genrec.engine.scoring_engine import ScoringEngine
from genrec.model import ModelConfig, build_model
from genrec.model.checkpoint import save_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SidVocab

SIZES = [4, 3]


def _vocab(sizes: list[int] = SIZES) -> SidVocab:
    codes = torch.cartesian_prod(*[torch.arange(k) for k in sizes])[:10]
    return SidVocab(SemanticIndex(codes, sizes), max_history=5)


def _model(vocab_size: int = NUM_SPECIAL + sum(SIZES)) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=64))


def test_from_pretrained_loads_the_vocabulary_and_the_saved_item_weight(tmp_path: Path) -> None:
    vocab = _vocab()
    save_model(_model(), tmp_path)
    vocab.save(tmp_path)
    save_item_weight(tmp_path, 2.5)
    engine = Engine.from_pretrained(tmp_path)
    assert engine.vocab is not None and engine.vocab.vocab_size == vocab.vocab_size
    assert engine.config.soft_token_id == vocab.soft_id and engine.item_weight == 2.5
    assert Engine.from_pretrained(tmp_path, config=EngineConfig(item_weight=0.0)).item_weight == 0
    got = engine.recommend([RecommendRequest(history=["1", "2"])], BeamParams(beam_width=4, n=3))
    assert len(got[0].items) == 3 and set(got[0].items) <= {str(i) for i in range(10)}


def test_an_engine_scores_as_a_scoring_engine_does() -> None:
    model = _model()
    engine, scorer = Engine(model, vocab=_vocab()), ScoringEngine(model)
    assert isinstance(engine, ScoringEngine)
    params = ScoreParams(mode="loglik")
    want = scorer.score([5, 6], [[7, 8], [9]], params)
    assert torch.equal(engine.score([5, 6], [[7, 8], [9]], params), want)


def test_a_vocabulary_the_model_cannot_hold_is_refused_and_the_old_one_kept() -> None:
    engine = Engine(_model(), vocab=_vocab())
    before = engine.catalog
    big = _vocab([4, 30])
    with pytest.raises(ValueError, match=f"needs {big.vocab_size} tokens, the model has"):
        engine.set_vocab(big)
    assert engine.catalog is before
    with pytest.raises(ValueError, match="needs"):
        Engine(_model(), vocab=big)


def test_a_new_vocabulary_is_a_new_catalog_version() -> None:
    engine = Engine(_model(), vocab=_vocab())
    assert engine.catalog is not None and engine.catalog.version == 0
    engine.set_vocab(_vocab())
    assert engine.catalog.version == 1 and len(engine.ids) == 10


def test_without_a_vocabulary_there_is_no_catalog() -> None:
    engine = Engine(_model())
    assert engine.vocab is None and engine.catalog is None
    with pytest.raises(ValueError, match="no Semantic-ID vocabulary"):
        _ = engine.ids
