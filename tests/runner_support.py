"""A small Semantic-ID engine, requests with filters and a soft token, and a catalog delta,
for the beam-search runner and pool tests."""

from __future__ import annotations

import torch

from genrec import Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

SIZES = [6, 5, 4]  # codebook sizes
N_ITEMS = 60


def small_engine(**config: object) -> Engine:
    g = torch.Generator().manual_seed(0)
    ids = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    index = SemanticIndex(ids[torch.randperm(ids.shape[0], generator=g)[:N_ITEMS]], SIZES)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, user_dim=3, max_position_embeddings=128)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID, **config),
                  vocab=SidVocab(index, max_history=12))


def sample_requests() -> list[RowRequest]:
    return [
        RowRequest([3, 17, 8]),
        RowRequest([1], user_vector=[0.5, -1.0, 0.2]),
        RowRequest([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], exclude=[0, 1, 2, 40]),
        RowRequest([20, 21], allow=[4, 9, 30, 31, 55]),
    ]


def add_delta(engine: Engine) -> None:
    # retired items and moved / new items in the catalog's delta part
    cat = engine.catalog
    free = [c for c in torch.cartesian_prod(*[torch.arange(k) for k in SIZES]).tolist()
            if int(cat.lookup(torch.tensor(c))) < 0]
    engine.set_catalog(cat.updated([(N_ITEMS, free[0]), (7, free[1])], retire=[3, 26]))
