"""The main job: nothing -> a running recommender.

Synthetic data with natural Semantic IDs -> a tiny Qwen3 generative-retrieval model trained
from scratch -> saved with its Semantic-ID vocabulary, reloaded with ``Engine.from_pretrained``
-> Recall/NDCG@10 of full-catalog beam search against popularity -> genrec's HTTP server, one
real ``POST /v1/recommend`` for a sample user -> the commands for your own data -> serving until
Ctrl-C (``serve=False``: stop after printing).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from genrec.demo.quality import Quality, evaluate, heldout_request
from genrec.demo.synthetic import (
    SyntheticConfig,
    generate,
    item_name,
    popularity,
    semantic_index,
    split_users,
)
from genrec.demo.train import TrainConfig, tiny_config, train_model
from genrec.engine import BeamParams, Engine
from genrec.model import save_model
from genrec.vocab.sid_vocab import SidVocab

MAX_HISTORY = 20  # items in a prompt; the synthetic sequences are shorter
BEAM_WIDTH = 20


def default_out_dir() -> Path:
    """``$XDG_CACHE_HOME/genrec/demo`` (``~/.cache/genrec/demo`` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "genrec" / "demo"


@dataclass
class DemoResult:
    """What the demo measured and the HTTP exchange it showed."""

    out_dir: Path
    losses: list[float]
    model: Quality
    popularity: Quality
    sample_user: int
    sample_target: int
    url: str
    request: dict[str, Any]
    answer: dict[str, Any]
    reload_max_diff: float
    seconds: dict[str, float] = field(default_factory=dict)


def run_demo(
    out_dir: str | Path | None = None,
    data_config: SyntheticConfig | None = None,
    train_config: TrainConfig | None = None,
    num_heldout: int = 500,
    k: int = 10,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    num_threads: int | None = 1,
    serve: bool = True,
    port: int | None = None,
) -> DemoResult:
    """Run the whole demo; every figure it prints is computed here.

    With ``serve`` the server keeps running after the printout until Ctrl-C; ``port`` (None
    or 0: a free one) is where it listens on 127.0.0.1. ``num_threads`` sets torch's intra-op
    threads while the demo runs (restored afterwards; None keeps torch's setting). One is the
    default: the demo's ops are too small to gain much from more, and OpenMP threads that
    spin-wait make it many times slower whenever other processes share the cores.
    """
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _run(out_dir, data_config, train_config, num_heldout, k, progress, echo, serve,
                    port)
    finally:
        torch.set_num_threads(previous)


def _run(
    out_dir: str | Path | None, data_config: SyntheticConfig | None,
    train_config: TrainConfig | None, num_heldout: int, k: int, progress: bool,
    echo: Callable[[str], None], serve: bool, port: int | None,
) -> DemoResult:
    from genrec.demo import serving  # FastAPI and uvicorn load here, not on import

    serving.check_port(port)
    data_config = data_config or SyntheticConfig()
    train_config = train_config or TrainConfig()
    out = Path(out_dir) if out_dir is not None else default_out_dir()
    seconds: dict[str, float] = {}
    t0 = clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = now - clock
        clock = now

    data = generate(data_config)
    train_users, heldout = split_users(data, num_heldout, seed=data_config.seed)
    counts = popularity(data, train_users)
    vocab = SidVocab(semantic_index(data), max_history=MAX_HISTORY)
    n_inter = sum(len(data.sequences[u]) for u in train_users)
    sizes = vocab.index.codebook_sizes
    echo(f"data: {data_config.num_items} items in {data_config.num_clusters} clusters, "
         f"{data_config.num_users} users ({len(train_users)} train, {len(heldout)} held out), "
         f"{n_inter} training interactions")
    echo(f"Semantic IDs: item -> (cluster, rank inside the cluster), {vocab.num_levels} tokens "
         f"per item (codebooks {' x '.join(map(str, sizes))}); vocabulary {vocab.vocab_size} "
         f"tokens with bos/soft/pad")
    lap("data")

    model_config = tiny_config(vocab.vocab_size, max_positions=64)
    sequences = [vocab.prompt(data.sequences[u]) for u in train_users]
    echo(f"model: {model_config.architecture}, hidden {model_config.hidden_size}, "
         f"{model_config.num_hidden_layers} layers, {model_config.num_attention_heads} heads / "
         f"{model_config.num_key_value_heads} KV heads, head_dim {model_config.head_dim}; "
         f"{train_config.steps} steps x {train_config.batch_size} sequences")
    model, losses = train_model(model_config, sequences, train_config, progress=progress)
    n_params = sum(p.numel() for p in model.parameters())
    echo(f"trained {n_params / 1e3:.0f}k parameters: loss {losses[0]:.3f} -> "
         f"{sum(losses[-20:]) / len(losses[-20:]):.3f} (mean of last 20 steps)")
    lap("train")

    save_model(model, out)
    vocab.save(out)
    engine = Engine.from_pretrained(out)
    user = heldout[0]
    request = heldout_request(data, user)
    params = BeamParams(beam_width=BEAM_WIDTH, n=k)
    loaded = engine.recommend_rows([request], params)[0]
    trained = Engine(model, vocab=vocab).recommend_rows([request], params)[0]
    reload_diff = max(abs(a - b) for a, b in zip(loaded.scores, trained.scores, strict=True))
    if loaded.items != trained.items:
        raise RuntimeError("the reloaded engine recommends other items than the trained model")
    echo(f"saved model + Semantic-ID vocabulary to {out}; Engine.from_pretrained reloads it as "
         f"a generative engine (max |score difference| vs the trained model: "
         f"{reload_diff:.2e})")
    lap("save+load")

    model_q, pop_q, _ = evaluate(engine, data, heldout, counts, k=k, beam_width=BEAM_WIDTH)
    echo(f"\nquality over {len(heldout)} held-out users (target: their last item; full catalog "
         f"of {data_config.num_items} items, history excluded):")
    label = f"genrec (Engine.recommend, beam {BEAM_WIDTH})"
    echo(f"  {label:<36} Recall@{k} {model_q.recall:.3f}   NDCG@{k} {model_q.ndcg:.3f}")
    echo(f"  {'popularity (most popular unseen)':<36} Recall@{k} {pop_q.recall:.3f}   "
         f"NDCG@{k} {pop_q.ndcg:.3f}")
    lap("eval")

    server = serving.start_server(engine, port)
    try:
        url = f"{server.url}/v1/recommend"
        named = [item_name(i) for i in request.history]  # the catalog's own ids
        body = {"history": named, "exclude": named, "n": k, "beam_width": BEAM_WIDTH}
        sent = time.perf_counter()
        answer = serving.post_json(url, body)
        ms = (time.perf_counter() - sent) * 1e3
        target = data.sequences[user][-1]
        serving.print_exchange(echo, data, user, url, body, answer, target, ms)
        lap("server")
        serving.print_next_steps(echo, out)
        total = time.perf_counter() - t0
        phases = ", ".join(f"{name} {s:.1f} s" for name, s in seconds.items())
        echo(f"\ntime: {total:.1f} s ({phases})")
        seconds["total"] = total
        if serve:
            serving.serve_until_interrupted(server, echo)
    finally:
        server.stop()
    return DemoResult(
        out_dir=out, losses=losses, model=model_q, popularity=pop_q, sample_user=user,
        sample_target=target, url=url, request=body, answer=answer,
        reload_max_diff=reload_diff, seconds=seconds,
    )
