"""One measurement of ``bench/catalog.py`` in its own process (so that its peak RSS is its
own): ``--impl sparse`` (genrec's catalog), ``dense`` (the old dense trie, see
``_dense_engine.py``) or ``check`` (both on a small catalog: same items and scores?). Writes
one JSON object to ``--out``."""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _catalog_data import (  # noqa: E402
    FILTERS,
    HISTORY,
    UpdatePlan,
    feasible,
    make_requests,
    random_sids,
    state_nbytes,
    tiny_engine,
    update_plan,
    wait_quiet,
)
from _dense_engine import DenseCatalog, dense_recommend  # noqa: E402
from common import time_fn  # noqa: E402

from genrec import BeamParams, Engine  # noqa: E402
from genrec.catalog.semantic_ids import SemanticIndex  # noqa: E402
from genrec.engine import RowRequest  # noqa: E402
from genrec.live_catalog.state import CatalogState  # noqa: E402
from genrec.vocab.sid_vocab import NUM_SPECIAL, SidVocab  # noqa: E402

Json = dict[str, Any]
QUIET_WAIT = [0.0]  # --quiet-wait, set by main


def med(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, Any]:
    """Median seconds of ``repeats`` timed calls after ``warmup`` untimed ones (once the
    machine is quiet, see ``--quiet-wait``), and the last result."""
    wait_quiet(QUIET_WAIT[0])
    timing, out = time_fn(fn, repeats, warmup)
    return timing.median, out


def sparse_levels(state: CatalogState) -> list[Json]:
    """How each trie level is stored."""
    return [{"nodes": lv.num_nodes, "K": lv.size, "dense": lv.dense, "bytes": lv.nbytes()}
            for lv in state.trie.levels]


def recommend_grid(args: argparse.Namespace, n: int, catalogs: dict[str, Any],
                   run: Callable[[Any, list[RowRequest], BeamParams], Any],
                   filter_cost: Callable[[Any, list[RowRequest]], Any]) -> list[Json]:
    """Median recommend latency for every catalog x batch x filter x width (after two warm-up
    calls), and the filters' own cost per batch."""
    out = []
    for label, cat in catalogs.items():
        for batch in args.batches:
            for kind in FILTERS:
                reqs = make_requests(n, batch, kind, seed=1000 + batch)
                f_s, _ = med(lambda c=cat, r=reqs: filter_cost(c, r), args.repeats)
                for width in args.widths:
                    params = BeamParams(width, min(10, width))
                    call = functools.partial(run, cat, reqs, params)
                    busy = wait_quiet(args.quiet_wait)
                    first, _ = time_fn(call, 1, warmup=1)
                    # calls under 0.1 s: three times as many (a load burst weighs less)
                    reps = args.repeats * (3 if first.best < 0.1 else 1)
                    timing, _ = time_fn(call, reps, warmup=0)
                    s = timing.median
                    out.append({"catalog": label, "batch": batch, "filter": kind,
                                "width": width, "ms": s * 1e3, "best_ms": timing.best * 1e3,
                                "calls": reps, "filter_ms": f_s * 1e3, "others_busy": busy})
                    print(f"  {label} batch {batch} {kind} width {width}: {s * 1e3:.1f} ms",
                          flush=True)
    return out


def run_sparse(args: argparse.Namespace, codes: torch.Tensor, sizes: list[int],
               engine: Engine, rec: Json) -> None:
    n = codes.shape[0]
    vocab = SidVocab(SemanticIndex(codes, sizes), max_history=HISTORY)
    rec["build_s"], state = med(lambda: CatalogState.build(vocab, "cpu"),
                                3 if n <= 1_000_000 else 2, warmup=0)
    rec["trie_bytes"], rec["state_bytes"] = state.trie.nbytes(), state_nbytes(state)
    rec["levels"] = sparse_levels(state)
    engine.set_catalog(state)

    def apply(base: CatalogState, plan: UpdatePlan) -> CatalogState:
        new = base.updated(plan.upsert, plan.retire)
        engine.set_catalog(new)  # installed: the next recommend searches it
        return new

    updates, after = {}, {}
    one_retire = UpdatePlan([], [n // 3])
    updates["retire_1"], _ = med(lambda: apply(state, one_retire), 3)
    for k in args.changes:
        if feasible(n, k):
            plan = update_plan(codes, sizes, k, seed=100 + k)
            updates[f"changes_{k}"], after[k] = med(lambda p=plan: apply(state, p), 3)
            if k == 1000:
                rec["visible"] = visible(engine, after[k], plan, n)
    big = max(after)
    largest, live = after[big], after.get(1000, after[big])
    on_big = update_plan(largest.vocab.index.codes, sizes, 1, seed=7)
    updates[f"changes_1_on_delta_{big}"], _ = med(lambda s=largest: apply(s, on_big), 3)
    rec["updates_s"] = updates
    rec["delta_state_bytes"] = state_nbytes(live)
    rec["compact_s"], compacted = med(live.compacted, 2 if n <= 1_000_000 else 1, warmup=0)
    reqs = make_requests(n, 4, "exclude100", seed=5)
    same = [r.items for r in engine.recommend_rows(reqs, BeamParams(32, 10), catalog=live)] == [
        r.items for r in engine.recommend_rows(reqs, BeamParams(32, 10), catalog=compacted)]
    rec["compacted_answers_equal"] = same
    del compacted, after, largest
    if args.paired_items and args.paired_items < n:
        rec["paired"] = paired(args, engine, {"fresh": state, "delta": live}, n)
        rec["paired_items"] = args.paired_items
    rec["recommend"] = recommend_grid(
        args, n, {"fresh": state, "delta": live},
        lambda c, r, p: engine.recommend_rows(r, p, catalog=c),
        lambda c, r: c.search_filters([q.allow for q in r], [q.exclude for q in r]))


def paired(args: argparse.Namespace, engine: Engine, catalogs: dict[str, CatalogState],
           n: int) -> list[Json]:
    """Latency on a small catalog (``--paired-items``, fresh and after 1,000 + 1,000 changes)
    and on this one, alternating call by call in this process so that both see the same
    machine load, for every catalog x batch x filter x width."""
    m = args.paired_items
    codes, sizes = random_sids(m, args.seed)
    small = CatalogState.build(SidVocab(SemanticIndex(codes, sizes), max_history=HISTORY))
    plan = update_plan(codes, sizes, 1000, seed=1100)
    smalls = {"fresh": small, "delta": small.updated(plan.upsert, plan.retire)}
    out = []
    for label, large in catalogs.items():
        for batch in args.batches:
            for kind in FILTERS:
                cases = {"small": (smalls[label], make_requests(m, batch, kind, seed=1000 + batch)),
                         "large": (large, make_requests(n, batch, kind, seed=1000 + batch))}
                for width in args.widths:
                    params = BeamParams(width, min(10, width))
                    busy = wait_quiet(args.quiet_wait)
                    times: dict[str, list[float]] = {"small": [], "large": []}
                    rounds = 2 * args.repeats + 1
                    for rep in range(rounds):
                        for side, (cat, reqs) in cases.items():
                            t0 = time.perf_counter()
                            engine.recommend_rows(reqs, params, catalog=cat)
                            if rep:  # the first round warms up
                                times[side].append(time.perf_counter() - t0)
                        if rep == 1 and times["large"][0] > 0.1:
                            rounds = args.repeats + 1  # slow settings: half as many rounds
                        if rep + 1 >= rounds:
                            break
                    out.append({"catalog": label, "batch": batch, "filter": kind,
                                "width": width, "others_busy": busy,
                                **{f"{k}_ms": statistics.median(v) * 1e3
                                   for k, v in times.items()}})
                    print(f"  paired {label} batch {batch} {kind} width {width}: "
                          f"{out[-1]['small_ms']:.1f} / {out[-1]['large_ms']:.1f} ms", flush=True)
    return out


def visible(engine: Engine, state: CatalogState, plan: UpdatePlan, n: int) -> bool:
    """After the update: an allow list of 50 new and 50 retired items returns exactly the new
    ones, and every upserted ID looks up to its item."""
    new, gone = plan.new_items[:50], plan.retire[:50]
    got = engine.recommend_rows([RowRequest([0, 1, 2], allow=new + gone)],
                           BeamParams(128, 100), catalog=state)[0].items
    items = torch.tensor([i for i, _ in plan.upsert])
    found = state.lookup(torch.tensor([c for _, c in plan.upsert]))
    return sorted(got) == sorted(new) and bool((found == items).all())


def run_dense(args: argparse.Namespace, codes: torch.Tensor, sizes: list[int],
              engine: Engine, rec: Json) -> None:
    n = codes.shape[0]
    big = n >= 1_000_000
    rec["build_s"], cat = med(lambda: DenseCatalog.build(codes, sizes), 1 if big else 3, 0)
    rec["trie_bytes"], rec["state_bytes"] = cat.trie.nbytes(), cat.nbytes()
    updates = {}
    updates["retire_1"], _ = med(lambda: cat.updated(retire=[n // 3]), 1 if big else 3, 0)
    plan = update_plan(codes, sizes, 1000, seed=1100)
    updates["changes_1000"], live = med(lambda: cat.updated(plan.upsert, plan.retire),
                                        1 if big else 3, 0)
    rec["updates_s"] = updates
    rec["delta_state_bytes"] = live.nbytes()
    offsets = SemanticIndex(codes, sizes).token_offsets(NUM_SPECIAL)
    rec["recommend"] = recommend_grid(
        args, n, {"fresh": cat, "delta": live},
        lambda c, r, p: dense_recommend(engine, c, r, p, offsets, HISTORY),
        lambda c, r: c.filter_counts([q.allow for q in r], [q.exclude for q in r]))


def run_check(args: argparse.Namespace, codes: torch.Tensor, sizes: list[int],
              engine: Engine, rec: Json) -> None:
    """Sparse and dense on the same catalog, fresh and after 1,000 + 1,000 changes (fewer on
    a catalog under 6,000 items): the same items, and the largest score difference."""
    n = codes.shape[0]
    vocab = SidVocab(SemanticIndex(codes, sizes), max_history=HISTORY)
    state, dense = CatalogState.build(vocab, "cpu"), DenseCatalog.build(codes, sizes)
    k = 1000 if feasible(n, 1000) else n // 4
    plan = update_plan(codes, sizes, k, seed=1100)
    pairs = {"fresh": (state, dense),
             "delta": (state.updated(plan.upsert, plan.retire),
                       dense.updated(plan.upsert, plan.retire))}
    offsets = vocab.level_offsets
    cases, worst, equal = 0, 0.0, True
    for sparse_cat, dense_cat in pairs.values():
        for kind in FILTERS:
            reqs = make_requests(n, 8, kind, seed=77)
            for width in args.widths:
                params = BeamParams(width, min(32, width))
                a = engine.recommend_rows(reqs, params, catalog=sparse_cat)
                b = dense_recommend(engine, dense_cat, reqs, params, offsets, HISTORY)
                for x, y in zip(a, b, strict=True):
                    cases += 1
                    equal &= x.items == y.items
                    if x.items == y.items and x.items:
                        diff = (torch.tensor(x.scores) - torch.tensor(y.scores)).abs().max()
                        worst = max(worst, float(diff))
    rec.update({"cases": cases, "items_equal": equal, "max_score_diff": worst})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--impl", choices=("sparse", "dense", "check"), required=True)
    p.add_argument("--items", type=int, required=True)
    p.add_argument("--widths", type=lambda s: [int(x) for x in s.split(",")], required=True)
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    p.add_argument("--changes", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paired-items", type=int, default=0)
    p.add_argument("--quiet-wait", type=float, default=0.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    QUIET_WAIT[0] = args.quiet_wait
    rec: Json = {"impl": args.impl, "items": args.items, "load_before": os.getloadavg()[0]}
    start = time.perf_counter()
    codes, sizes = random_sids(args.items, args.seed)
    rec["gen_s"], rec["codebook_sizes"] = time.perf_counter() - start, sizes
    engine = tiny_engine(sizes)
    {"sparse": run_sparse, "dense": run_dense, "check": run_check}[args.impl](
        args, codes, sizes, engine, rec)
    rec["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rec["load_after"] = os.getloadavg()[0]
    rec["wall_s"] = time.perf_counter() - start
    Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
