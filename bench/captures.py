"""Graph captures under a live update stream, counted on any device.

A stream of recommend requests (batches of ``--batch``, ``--rate`` requests a second of
simulated time, each with an ``exclude`` list of 0, 10, 100 or 1,000 items in turn) meets one
catalog update a second (``--upserts`` new items and one retired); the delta is compacted once
it reaches ``--compact-at`` items. Two engines answer every batch: static search runners
(``EngineConfig.static_search=True``, the CUDA default) and the runners keyed by catalog
version and filter shape. On a GPU each runner made is one graph captured (on the CPU the
same runners run eagerly: the count is what a GPU would capture). Prints captures per 1,000
requests for both, and checks that both engines return the same items.

Run: ``python bench/captures.py`` (a tiny random model; about a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from genrec import BeamParams, Engine, EngineConfig  # noqa: E402
from genrec.catalog.semantic_ids import SemanticIndex  # noqa: E402
from genrec.engine import RowRequest  # noqa: E402
from genrec.model import ModelConfig, build_model  # noqa: E402
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab  # noqa: E402

EXCLUDE_SIZES = (0, 10, 100, 1000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rate", type=float, default=100.0, help="requests per simulated second")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--upserts", type=int, default=20, help="new items per update")
    p.add_argument("--compact-at", type=int, default=400)
    p.add_argument("--width", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    sizes = [64, 64, 64]
    g = torch.Generator().manual_seed(0)
    space = torch.randint(0, 64, (int(args.items * 1.2), 3), generator=g).unique(dim=0)
    index = SemanticIndex(space[torch.randperm(space.shape[0], generator=g)[: args.items]],
                          sizes)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(sizes), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, max_position_embeddings=128)
    model = build_model(cfg)
    vocab = SidVocab(index, max_history=10)
    engines = {name: Engine(model, config=EngineConfig(soft_token_id=SOFT_ID, static_search=s),
                            vocab=vocab) for name, s in (("static", True), ("by version", False))}
    state = engines["static"].catalog
    taken = {tuple(c) for c in index.codes.tolist()}
    fresh = (c for c in torch.cartesian_prod(*[torch.arange(k) for k in sizes]).tolist()
             if tuple(c) not in taken)
    params = BeamParams(args.width, 5)
    updates = compactions = 0
    start = time.perf_counter()
    for first in range(0, args.requests, args.batch):
        second = int(first / args.rate)
        while updates < second:  # one update per simulated second
            n = state.num_items
            state = state.updated([(n + k, next(fresh)) for k in range(args.upserts)],
                                  retire=[updates])
            updates += 1
            if state.delta_items.numel() >= args.compact_at:
                state = state.compacted()
                compactions += 1
        requests = []
        for r in range(first, min(first + args.batch, args.requests)):
            hist = torch.randint(0, args.items, (8,), generator=g).tolist()
            size = EXCLUDE_SIZES[r % len(EXCLUDE_SIZES)]
            excl = torch.randint(0, args.items, (size,), generator=g).tolist() or None
            requests.append(RowRequest(hist, exclude=excl))
        answers = []
        for engine in engines.values():
            engine.set_catalog(state)
            answers.append([r.items for r in engine.recommend_rows(requests, params)])
        if answers[0] != answers[1]:
            raise SystemExit(f"batch at request {first}: the engines disagree")
    seconds = time.perf_counter() - start
    print(f"{args.requests} requests ({args.rate:g}/s simulated, batches of {args.batch}, "
          f"exclude sizes {list(EXCLUDE_SIZES)}), {updates} updates of {args.upserts} items, "
          f"{compactions} compactions, {args.items:,} items at start, width {args.width}; "
          f"{seconds:.0f} s")
    for name, engine in engines.items():
        made = engine.searches.stats().runners_made
        print(f"  {name}: {made} runners made (graphs captured on a GPU), "
              f"{1000 * made / args.requests:.1f} per 1,000 requests")


if __name__ == "__main__":
    main()
