"""A generative server over a large random catalog, run as its own process by the load tests
(not a test module).

    python serving_load_server.py CODES.pt PORT [THREADS]

CODES.pt: ``torch.save`` of ``{"codes": int64 [N, L], "sizes": [K_0, ...]}`` (see
:func:`random_catalog`). Serves a tiny random Qwen3 model (user_dim 0) whose Semantic-ID
vocabulary is that catalog, on 127.0.0.1:PORT, until SIGTERM. Generative catalog updates go
to the engine's catalog (no ranker), with background compaction at its default threshold.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from genrec import Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex, group_counter, mixed_radix_key
from genrec.model import ModelConfig, build_model
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab


def random_catalog(n: int, seed: int = 0, levels: int = 3, size: int = 256
                   ) -> tuple[torch.Tensor, list[int]]:
    """``n`` random IDs of ``levels`` x ``size`` codes, made unique by a last dedup level
    (its code: how many earlier items share the same prefix), vectorised: codes [n, L + 1]
    and the codebook sizes."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, size, (n, levels), generator=g)
    dedup = group_counter(mixed_radix_key(codes, [size] * levels))
    return torch.cat([codes, dedup[:, None]], 1), [size] * levels + [int(dedup.max()) + 1]


def engine_for(codes: torch.Tensor, sizes: list[int], item_ids: list[str] | None = None
               ) -> Engine:
    """A tiny random generative model over ``codes`` (max_history 10), its items named
    ``item_ids`` (``None``: by their rows' numbers)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(sizes), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, max_position_embeddings=64)
    model = build_model(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # peaked next-code distributions, like a trained model
    vocab = SidVocab(SemanticIndex(codes, sizes, item_ids), max_history=10)
    return Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)


def main() -> None:
    from genrec.serving import ServeConfig, create_app, run_server

    codes_file, port = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        torch.set_num_threads(int(sys.argv[3]))
    data = torch.load(Path(codes_file))
    engine = engine_for(data["codes"], data["sizes"])
    app = create_app(engine, config=ServeConfig(max_batch_size=8, max_wait_ms=2))
    run_server(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
