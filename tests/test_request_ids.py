"""The public ``Engine.recommend`` in the catalog's own ids: the same search as the row-level
path, unknown history / exclude ids ignored and reported, unknown allow ids refused."""

from __future__ import annotations

import pytest
import torch

from genrec import BeamParams, Engine, EngineConfig, InputError, RecommendRequest
from genrec.catalog.id_map import IdMap
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

SIZES = [5, 4, 3]
N_ITEMS = 30
NAMES = [f"sku-{i * 7}" for i in range(N_ITEMS)]  # row i is "sku-<7i>"
PARAMS = BeamParams(beam_width=12, n=6)


def _engine(names: list[str] | None) -> Engine:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    codes = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    codes = codes[torch.randperm(codes.shape[0], generator=g)[:N_ITEMS]]
    vocab = SidVocab(SemanticIndex(codes, SIZES, names), max_history=6)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, user_dim=5, max_position_embeddings=64)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)


@pytest.fixture(scope="module")
def named() -> Engine:
    return _engine(NAMES)


def _rows(ids: list[str]) -> list[int]:
    return [NAMES.index(i) for i in ids]


def test_ids_in_and_out_equal_the_row_search(named: Engine) -> None:
    history, exclude, allow = ["sku-21", "sku-70", "sku-0"], ["sku-14"], NAMES[::2]
    [rec] = named.recommend([RecommendRequest(history, exclude=exclude, allow=allow)], PARAMS)
    [want] = named.recommend_rows([RowRequest(_rows(history), exclude=_rows(exclude),
                                              allow=_rows(allow))], PARAMS)
    assert rec.items == [NAMES[r] for r in want.items] and rec.scores == want.scores
    assert rec.ignored == []
    assert all(isinstance(i, str) for i in rec.items) and "sku-14" not in rec.items


def test_unknown_history_and_exclude_ids_are_ignored_and_reported(named: Engine) -> None:
    [rec] = named.recommend([RecommendRequest(["sku-21", "nope", "sku-70"],
                                              exclude=["sku-14", 99])], PARAMS)
    [want] = named.recommend([RecommendRequest(["sku-21", "sku-70"], exclude=["sku-14"])],
                             PARAMS)
    assert rec.items == want.items and rec.ignored == ["nope", "99"]


def test_unknown_allow_id_is_an_error_naming_the_field_and_id(named: Engine) -> None:
    with pytest.raises(ValueError, match=r"requests\[1\]\.allow: unknown item ids \['sku-1'\]"):
        named.recommend([RecommendRequest(["sku-0"]),
                         RecommendRequest(["sku-0"], allow=["sku-7", "sku-1"])], PARAMS)


def test_a_history_of_unknown_ids_only_is_an_error(named: Engine) -> None:
    with pytest.raises(InputError, match=r"requests\[0\]\.history: none of its 2 items"):
        named.recommend([RecommendRequest(["x", "y"])], PARAMS)
    with pytest.raises(InputError, match=r"requests\[0\]\.history\[0\]: an item id is a"):
        named.recommend([RecommendRequest([1.5])], PARAMS)


def test_a_catalog_without_names_takes_integers_as_their_ids() -> None:
    engine = _engine(None)
    [rec] = engine.recommend([RecommendRequest([3, "17", 8])], PARAMS)
    [want] = engine.recommend_rows([RowRequest([3, 17, 8])], PARAMS)
    assert rec.items == [str(r) for r in want.items]


def test_ids_installed_with_a_catalog_name_its_rows(named: Engine) -> None:
    engine = _engine(None)
    engine.set_catalog(engine.catalog, IdMap.build(NAMES))
    [rec] = engine.recommend([RecommendRequest(["sku-21", "sku-70"])], PARAMS)
    assert rec.items == [NAMES[r] for r in engine.recommend_rows([RowRequest([3, 10])],
                                                                PARAMS)[0].items]
    with pytest.raises(ValueError, match="ids: 2 ids for a catalog of 30 items"):
        engine.set_catalog(engine.catalog, IdMap.build(["a", "b"]))
