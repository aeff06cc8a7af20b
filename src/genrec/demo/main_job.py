"""The main job: synthetic data -> tiny Qwen3 trained from scratch -> saved, reloaded strictly
-> multi-item scoring of a sample user -> HitRate@10 against a popularity baseline."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from genrec.demo.evaluate import (
    RankingMetrics,
    evaluate,
    sample_candidates,
    score_items,
    user_prefix,
)
from genrec.demo.synthetic import (
    SyntheticConfig,
    SyntheticData,
    generate,
    item_token,
    popularity,
    split_users,
)
from genrec.demo.train import TrainConfig, tiny_config, train_model
from genrec.engine import Engine
from genrec.model import save_model


def default_out_dir() -> Path:
    """``$XDG_CACHE_HOME/genrec/demo`` (``~/.cache/genrec/demo`` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "genrec" / "demo"


@dataclass
class DemoResult:
    """What the demo measured."""

    out_dir: Path
    losses: list[float]
    model: RankingMetrics
    popularity: RankingMetrics
    sample_user: int
    sample_ranking: list[tuple[int, float]]  # (item, loglik), best first
    sample_target: int
    reload_max_diff: float
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def chance_hit_rate(self) -> float:
        return self.model.k / (self.model.num_negatives + 1)


def run_demo(
    out_dir: str | Path | None = None,
    data_config: SyntheticConfig | None = None,
    train_config: TrainConfig | None = None,
    num_heldout: int = 500,
    num_negatives: int = 99,
    k: int = 10,
    num_candidates: int = 20,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    num_threads: int | None = 1,
) -> DemoResult:
    """Run the whole demo; every figure it prints is computed here.

    ``num_threads`` sets torch's intra-op threads while the demo runs (restored afterwards;
    None keeps torch's setting). One is the default: the demo's ops are too small to gain
    much from more, and OpenMP threads that spin-wait make it many times slower whenever
    other processes share the cores.
    """
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _run(out_dir, data_config, train_config, num_heldout, num_negatives, k,
                    num_candidates, progress, echo)
    finally:
        torch.set_num_threads(previous)


def _run(
    out_dir: str | Path | None, data_config: SyntheticConfig | None,
    train_config: TrainConfig | None, num_heldout: int, num_negatives: int, k: int,
    num_candidates: int, progress: bool, echo: Callable[[str], None],
) -> DemoResult:
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
    n_inter = sum(len(data.sequences[u]) for u in train_users)
    echo(f"data: {data_config.num_items} items in {data_config.num_clusters} clusters, "
         f"{data_config.num_users} users ({len(train_users)} train, {len(heldout)} held out), "
         f"{n_inter} training interactions; item i = token i + {item_token(0)}")
    lap("data")

    model_config = tiny_config(data_config.vocab_size, max_positions=data_config.max_len + 8)
    sequences = [user_prefix(data.sequences[u]) for u in train_users]
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
    engine = Engine.from_pretrained(out)
    user = heldout[0]
    candidates, target = sample_candidates(data, user, num_candidates, seed=data_config.seed)
    history = data.sequences[user][:-1]
    scores = score_items(engine, history, candidates)
    trained = score_items(Engine(model), history, candidates)
    reload_diff = max(abs(a - b) for a, b in zip(scores, trained, strict=True))
    echo(f"saved to {out}, reloaded strictly with Engine.from_pretrained "
         f"(max |score difference| vs the trained model: {reload_diff:.2e})")
    lap("save+load")

    ranking = sorted(zip(candidates, scores, strict=True), key=lambda x: -x[1])
    _print_sample(echo, data, user, history, ranking, target)
    lap("sample")

    model_m, pop_m = evaluate(engine, data, heldout, counts, k=k, num_negatives=num_negatives,
                              seed=data_config.seed + 1)
    chance = k / (num_negatives + 1)
    echo(f"\nquality over {len(heldout)} held-out users (their last item vs {num_negatives} "
         f"sampled unseen items, each user one Engine.score request):")
    echo(f"  {'genrec model (loglik)':<24} HitRate@{k} {model_m.hit_rate:.3f}   "
         f"NDCG@{k} {model_m.ndcg:.3f}")
    echo(f"  {'popularity baseline':<24} HitRate@{k} {pop_m.hit_rate:.3f}   "
         f"NDCG@{k} {pop_m.ndcg:.3f}")
    echo(f"  {'random':<24} HitRate@{k} {chance:.3f}")
    lap("eval")

    total = time.perf_counter() - t0
    phases = ", ".join(f"{name} {s:.1f} s" for name, s in seconds.items())
    echo(f"\ntime: {total:.1f} s ({phases})")
    seconds["total"] = total
    return DemoResult(
        out_dir=out, losses=losses, model=model_m, popularity=pop_m, sample_user=user,
        sample_ranking=ranking, sample_target=target, reload_max_diff=reload_diff,
        seconds=seconds,
    )


def _print_sample(
    echo: Callable[[str], None], data: SyntheticData, user: int, history: list[int],
    ranking: list[tuple[int, float]], target: int,
) -> None:
    clusters = data.item_cluster
    current = int(clusters[history[-1]])
    echo(f"\nsample held-out user {user} (preferred cluster {int(data.preferred[user])}), "
         f"history of {len(history)} items, oldest first:")
    echo("  item    " + " ".join(f"{i:>4}" for i in history))
    echo("  cluster " + " ".join(f"{int(clusters[i]):>4}" for i in history))
    echo(f"scores of {len(ranking)} candidates (log p(item | history), one request, "
         f"prefix computed once), best first:")
    echo(f"  {'rank':>4} {'item':>5} {'cluster':>7} {'score':>8}")
    for rank, (item, score) in enumerate(ranking, 1):
        notes = []
        if item == target:
            notes.append("<- true next item (held out)")
        elif int(clusters[item]) == current:
            notes.append("same cluster as last item")
        line = f"  {rank:>4} {item:>5} {int(clusters[item]):>7} {score:>8.3f}  {' '.join(notes)}"
        echo(line.rstrip())
