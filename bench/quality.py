"""Recommendation quality: genrec against RecBole's SASRec and popularity, on one split.

Every method is scored on the same test users of genrec's leave-one-out split (last item = test
target, full ranking over all items) by the same code (``genrec.evaluation.topk_metrics``), twice:
as ``genrec eval`` does (history items not masked: an item the user already has may be
recommended and counts as a miss unless it is the target), and with each user's earlier items
masked (never recommended), as RecBole does for its general models such as Pop.

- genrec: a trained model (``--model``; or ``--train OUT`` trains one first with
  ``--train-args``), full-catalog constrained beam search (``evaluate_generative``), or an
  ensemble of models over the same index (``--ensemble``, as ``genrec eval --ensemble``);
  without ``--model``, RecBole and Pop only;
- Pop: the most frequent training items (``evaluate_popularity``, genrec's code);
- SASRec and Pop by RecBole 1.2.1 (``--recbole-python``): its defaults (SASRec: 2 layers,
  hidden 64, max length 50, cross-entropy, Adam lr 1e-3, batch 2048, validation every epoch,
  early stopping after 10 epochs without gain, best epoch kept), trained in RecBole's own
  environment by ``bench/_recbole_worker.py`` on the same split written as an atomic file, with
  the training time capped by ``--recbole-minutes`` (of CPU time by default, validation not
  counted) on ``--recbole-threads`` threads. The worker returns each test user's top-10 items;
  the metrics are computed here. ``--reuse-recbole`` reuses the answer kept in ``--work`` when
  it answers the same job (a long SASRec run compared with several genrec models).

Pop is shown twice. genrec's counts every training interaction (ties: lower item index first).
RecBole 1.2.1's Pop adds one per item per training batch (``item_cnt[item] += 1`` with
repeated indices counts an item once per batch), so it ranks items by the number of shuffled
2048-row batches they occur in, and the most popular items tie; it runs here without negative
sampling, which would add the sampled negatives to its counts.

RecBole's environment (once; prints the ``--recbole-python`` to give)::

    python bench/quality.py --setup-recbole DIR
    # = python -m venv DIR && DIR/bin/pip install torch==2.13.0 "numpy==1.26.*" \\
    #       "scipy==1.12.*" "pandas<2.2" recbole==1.2.1

Runs::

    python bench/quality.py --smoke                       # tiny generated data, seconds
    python bench/quality.py --data ../shared/datasets/amazon18-scientific --model RUN \\
        --recbole-python DIR/bin/python --json out.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _quality_data import (  # noqa: E402
    make_job,
    metrics_of_top,
    run_worker,
    setup_recbole,
    write_atomic,
    write_toy_dataset,
)
from common import format_table, machine_note, write_json  # noqa: E402

from genrec.data import load_json_dataset  # noqa: E402
from genrec.evaluation.full_catalog import (  # noqa: E402
    evaluate_generative,
    evaluate_popularity,
    full_histories,
    split_examples,
)

KEYS = ("recall@5", "ndcg@5", "recall@10", "ndcg@10")
RECIPE = "--hidden 128 --layers 4 --epochs 12 --patience 3"  # docs/results.md, sid-rqvae
SMOKE_RECIPE = ("--hidden 16 --layers 1 --heads 2 --kv-heads 1 --head-dim 8 --epochs 1 "
                "--batch-tokens 400 --max-history 5 --val-users 20 --beam-width 10")
SMOKE_RECBOLE = {"SASRec": {"epochs": 2, "train_batch_size": 64, "hidden_size": 16,
                            "inner_size": 32, "MAX_ITEM_LIST_LENGTH": 10, "stopping_step": 1}}


def train_genrec(data: Path, out: Path, recipe: str, threads: int) -> float:
    """``genrec index`` (the dataset's sid-rqvae IDs) and ``genrec train generative`` with
    ``recipe`` into ``out``, in this process; returns the wall seconds."""
    from genrec.cli import app

    start = time.perf_counter()
    index = out / "index.json"
    for command in (["index", "--data", str(data), "--out", str(index)],
                    ["train", "generative", "--data", str(data), "--index", str(index), "--out",
                     str(out / "model"), *recipe.split(), "--threads", str(threads),
                     "--no-progress", "--device", "cpu"]):
        code = app(command, standalone_mode=False)
        if code:
            raise SystemExit(f"genrec {' '.join(command[:2])} failed (exit {code})")
    return time.perf_counter() - start


def genrec_side(models: list[Path], ds: Any, args: argparse.Namespace) -> tuple[dict, list,
                                                                               list]:
    """genrec's metrics (unmasked and masked) on the test split, of one model or of an
    ensemble (``--ensemble``: mean log-probabilities, as ``genrec eval --ensemble``); returns
    them, the examples and their full histories."""
    from genrec.commands.eval_generative import load_generative
    from genrec.engine.ensemble import Ensemble

    members = [load_generative(m, ds, "test", "cpu", "--ensemble" if k else "--model")
               for k, m in enumerate(models)]
    engine, vectors = members[0]
    if len(members) > 1:
        engine = Ensemble([e for e, _ in members])
    examples = split_examples(ds.sequences, "test", None, args.users, args.seed)
    histories = full_histories(ds.sequences, examples, "test")
    out = {}
    for name, exclude in (("unmasked", None), ("masked", histories)):
        start = time.perf_counter()
        out[name] = evaluate_generative(engine, examples, vectors, args.beam_width,
                                        batch_size=args.batch_size, exclude=exclude)
        out[name]["seconds"] = round(time.perf_counter() - start, 2)
    out["model"] = [str(m) for m in models] if len(models) > 1 else str(models[0])
    return out, examples, histories


def recbole_side(ds: Any, examples: list, histories: list, work: Path,
                 args: argparse.Namespace, overrides: dict) -> dict[str, Any]:
    """RecBole's models on the same split: the worker's top-10 lists scored here."""
    write_atomic(ds.sequences, work / "recbole-data", ds.name)
    job = make_job(work, ds.name, examples, histories, ds.num_items,
                   args.recbole_models.split(","), args.recbole_minutes * 60,
                   args.recbole_threads, overrides=overrides, clock=args.recbole_clock)
    start = time.perf_counter()
    answer = run_worker(args.recbole_python, job, work, reuse=args.reuse_recbole)
    targets = [ex.target for ex in examples]
    out: dict[str, Any] = {"versions": answer["versions"],
                           "wall_seconds": round(time.perf_counter() - start, 1)}
    for name, res in answer["results"].items():
        if res["target_mismatch"] or res["history_mismatch"] or res["missing_users"]:
            raise RuntimeError(f"RecBole {name}: its split differs from genrec's ("
                               f"{res['target_mismatch']} targets, {res['history_mismatch']} "
                               f"histories, {res['missing_users']} users missing)")
        out[name] = {"unmasked": metrics_of_top(res.pop("top"), targets),
                     "masked": metrics_of_top(res.pop("top_masked"), targets), **res}
    return out


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(results: dict[str, dict]) -> str:
    """The side-by-side tables (unmasked, masked) with genrec's ratios to each other method."""
    blocks = []
    for mode, title in (("unmasked", "history items not masked (genrec eval's protocol)"),
                        ("masked", "each user's earlier items masked")):
        rows = [[name, *(f"{r[mode][k]:.4f}" for k in KEYS)] for name, r in results.items()]
        base = results.get("genrec")
        for name, r in results.items() if base else ():
            if name != "genrec":
                rows.append([f"genrec / {name}",
                             *(ratio(base[mode][k], r[mode][k]) for k in KEYS)])
        blocks.append(f"{title}:\n" + format_table(["method", *KEYS], rows))
    return "\n\n".join(blocks)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, help="dataset folder (genrec's JSON format)")
    p.add_argument("--model", type=Path, help="trained genrec model (or its training folder)")
    p.add_argument("--ensemble", type=Path, action="append", default=[],
                   help="another genrec model over the same index, ranking with --model by the "
                        "mean log-probability (repeat for more)")
    p.add_argument("--train", type=Path, default=None,
                   help="train a genrec model into this folder first (index + training)")
    p.add_argument("--train-args", default=RECIPE, help="options of genrec train generative")
    p.add_argument("--users", type=int, default=None, help="a fixed sample of test users")
    p.add_argument("--seed", type=int, default=0, help="user sample seed")
    p.add_argument("--beam-width", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="genrec's torch threads")
    p.add_argument("--recbole-python", default=None,
                   help="interpreter of a RecBole 1.2.1 environment (RecBole skipped without)")
    p.add_argument("--recbole-models", default="SASRec,Pop")
    p.add_argument("--recbole-minutes", type=float, default=15.0,
                   help="cap on each RecBole model's training time (validation not counted)")
    p.add_argument("--recbole-threads", type=int, default=1)
    p.add_argument("--recbole-clock", choices=("cpu", "wall"), default="cpu",
                   help="what --recbole-minutes counts: the worker's CPU time (on a busy "
                        "machine, the compute it got) or wall time")
    p.add_argument("--recbole-config", default=None,
                   help='JSON overrides per model, e.g. \'{"SASRec": {"epochs": 5}}\'')
    p.add_argument("--work", type=Path, default=None, help="work folder (default: a temp one)")
    p.add_argument("--reuse-recbole", action="store_true",
                   help="reuse RecBole's answer kept in --work if it answers the same job")
    p.add_argument("--max-history", type=int, default=20,
                   help="without --model: the history length of the test examples (the "
                        "targets and masks do not depend on it)")
    p.add_argument("--setup-recbole", type=Path, default=None,
                   help="create RecBole's environment in this folder and exit")
    p.add_argument("--smoke", action="store_true",
                   help="tiny generated dataset, tiny models: checks the pipeline in seconds")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def compare(args: argparse.Namespace, work: Path, run: dict[str, Any]) -> tuple[Any, int, dict,
                                                                              str]:
    """Every method on the same test users; returns the dataset, the number of users, the
    results by method, and what became of RecBole."""
    overrides = json.loads(args.recbole_config) if args.recbole_config else {}
    if args.smoke:
        shutil.rmtree(work / "genrec", ignore_errors=True)
        args.data = write_toy_dataset(work / "toy")
        args.train, args.train_args = work / "genrec", SMOKE_RECIPE
        args.beam_width = min(args.beam_width, 10)
        overrides = {**SMOKE_RECBOLE, **overrides}
        args.recbole_minutes = min(args.recbole_minutes, 1.0)
    if args.data is None:
        raise SystemExit("give --data (and --model or --train), or --smoke")
    if args.train is not None:
        run["genrec_train_seconds"] = round(
            train_genrec(args.data, args.train, args.train_args, args.threads), 1)
        run["genrec_train_args"] = args.train_args
        args.model = args.train / "model"
    ds = load_json_dataset(args.data)
    results: dict[str, dict] = {}
    if args.model is not None:
        results["genrec"], examples, histories = genrec_side([args.model, *args.ensemble], ds,
                                                             args)
    else:  # RecBole and Pop only (e.g. a long SASRec run, reused later by --reuse-recbole)
        examples = split_examples(ds.sequences, "test", args.max_history, args.users, args.seed)
        histories = full_histories(ds.sequences, examples, "test")
    results["Pop"] = {m: evaluate_popularity(ds.sequences, examples, ds.num_items, exclude=h)
                      for m, h in (("unmasked", None), ("masked", histories))}
    if not args.recbole_python:
        return ds, len(examples), results, "skipped: no --recbole-python given (see " \
            "--setup-recbole)"
    rec = recbole_side(ds, examples, histories, work, args, overrides)
    run["recbole"] = {"versions": rec.pop("versions"), "wall_seconds": rec.pop("wall_seconds")}
    results |= {f"{name} (RecBole)": r for name, r in rec.items()}
    return ds, len(examples), results, "ran"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.setup_recbole:
        print(f"--recbole-python {setup_recbole(args.setup_recbole)}")
        return 0
    torch.set_num_threads(args.threads)
    temp = args.work is None
    work = Path(tempfile.mkdtemp(prefix="genrec-quality-")) if temp else args.work
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()  # the worker runs in it
    run: dict[str, Any] = {"command": sys.argv if argv is None else ["bench/quality.py", *argv]}
    ds, n_users, results, status = compare(args, work, run)
    print(f"{ds.name}: {n_users} test users, {ds.num_items} items; RecBole {status}")
    print(report(results))
    for name, r in results.items():
        if "train_seconds" in r:
            own, mode = r["recbole_test"], "masked" if r["masked_by_recbole"] else "unmasked"
            print(f"{name}: {r['train_seconds']:.0f} s of training ({r['clock']} time; "
                  f"{r['train_wall_seconds']:.0f} s wall), {len(r['epochs'])} epochs "
                  f"(best {r['best_epoch']}, stopped by {r['stopped_by']}); RecBole's own test "
                  f"metrics ({mode}): recall@10 {own['recall@10']:.4f}, ndcg@10 "
                  f"{own['ndcg@10']:.4f}")
    if args.json:
        write_json(args.json, {"machine": machine_note(), "run": run, "recbole": status,
                               "dataset": ds.name, "n_users": n_users, "results": results})
        print(f"\nwrote {args.json}")
    if temp:  # kept when something failed, for its logs
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
