"""A tiny catalog and engines with an item head, shared by the item-head and item-ranking
tests."""

from __future__ import annotations

import torch

from genrec import Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.model.registry import build_model
from genrec.training.generative_task import scratch_config, set_item_tokens
from genrec.vocab.sid_vocab import SOFT_ID, SidVocab

SIZES, N_ITEMS = [4, 5, 3], 40


def tiny_vocab() -> SidVocab:
    g = torch.Generator().manual_seed(0)
    codes = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    return SidVocab(SemanticIndex(codes[torch.randperm(codes.shape[0], generator=g)[:N_ITEMS]],
                                  SIZES), max_history=6)


def head_engine(seed: int = 0) -> Engine:
    torch.manual_seed(seed)
    vocab = tiny_vocab()
    cfg = scratch_config(vocab, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                         item_head=True)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
        model.item_head.weight.mul_(100)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)


def inputs_model(vocab: SidVocab, seed: int = 0, compose: bool = False,  # noqa: ANN201
                 item_dim: int = 0):
    torch.manual_seed(seed)
    cfg = scratch_config(vocab, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                         item_head=True, item_inputs=True, item_compose=compose,
                         item_dim=item_dim)
    model = build_model(cfg)
    set_item_tokens(model, vocab)
    return model
