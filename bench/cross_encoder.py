"""MiniLM teacher benchmark: candidate scores per second, prefix once against fan-out.

The DuoLM teacher started from all-MiniLM-L6-v2 (``genrec.duolm.cross_encoder``) scores each
user's candidates three ways, on the same token prompts (a prefix of ``--prefix`` tokens, the
history's titles; candidates of ``--cand-len`` tokens, an item's text):

(a) hf-pairs: transformers' ``BertModel``, one sequence per (prefix, candidate) pair, batched:
    the usual cross-encoder (its prefix also sees the candidate, so its scores differ);
(b) fanout: genrec's encoder, one sequence per pair under the teacher's mask (the prefix does
    not see the candidate): the same scores as (c), the prefix recomputed per candidate;
(c) prefix-once: genrec's multi-item scoring, the prefix encoded once per user and its keys
    and values shared by every candidate.

(b) and (c) must agree (max |difference| printed; exit 1 when above 1e-4). FLOPs count the
linear layers per token and attention per query-key pair, against the fp32 matmul peak of the
same run. Quick run: ``python bench/cross_encoder.py --candidates 10 --users 1``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as cm  # noqa: E402

from genrec.duolm.cross_encoder import CrossEncoder  # noqa: E402


def prompts(users: int, n: int, prefix: int, cand: int, seed: int
            ) -> tuple[list[list[int]], list[list[list[int]]]]:
    g = torch.Generator().manual_seed(seed)
    pre = [[101] + cm.random_tokens(prefix - 2, 30000, g, low=1000) + [102] for _ in range(users)]
    cands = [[cm.random_tokens(cand - 1, 30000, g, low=1000) + [102] for _ in range(n)]
             for _ in range(users)]
    return pre, cands


def fanout(model: CrossEncoder, pre: list[list[int]], cands: list[list[list[int]]], batch: int,
           hf: torch.nn.Module | None = None) -> list[torch.Tensor]:
    """Every (prefix, candidate) pair as its own sequence, ``batch`` at a time; the read-out
    is the mean of the candidate's hidden states, as the teacher's."""
    out = []
    for p, cs in zip(pre, cands, strict=True):
        scores = []
        for s in range(0, len(cs), batch):
            group = cs[s : s + batch]
            ids = torch.tensor([p + c for c in group])  # equal lengths here
            b, t = ids.shape
            if hf is not None:
                h = hf(input_ids=ids, token_type_ids=torch.tensor(
                    [[0] * len(p) + [1] * len(c) for c in group])).last_hidden_state
            else:
                mask = torch.ones(b, t, t, dtype=torch.bool)
                mask[:, : len(p), len(p):] = False
                seg = torch.tensor([[0] * len(p) + [1] * len(c) for c in group])
                h, _ = model.bert(ids, torch.arange(t).expand(b, t), seg, mask)
            scores.append(model.score(h[:, len(p):].mean(1))[:, 0])
        out.append(torch.cat(scores))
    return out


def flops(shape: dict, tokens: float, pairs: float) -> float:
    h, i, layers = shape["hidden"], shape["inner"], shape["layers"]
    return layers * (2 * (4 * h * h + 2 * h * i) * tokens + 4 * h * pairs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", default="10,50,100,200")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--prefix", type=int, default=261)
    ap.add_argument("--cand-len", type=int, default=49)
    ap.add_argument("--batch", type=int, default=16, help="pairs per fan-out forward")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    from genrec.catalog.embeddings import bundled_model_path

    model = CrossEncoder.from_sentence_encoder().eval()
    hf = transformers.BertModel.from_pretrained(bundled_model_path(), local_files_only=True,
                                                attn_implementation="sdpa").eval()
    c = model.bert.config
    shape = {"hidden": c.hidden_size, "inner": c.intermediate_size, "layers": c.num_hidden_layers}
    tracker = cm.PeakTracker(("float32",))
    tracker.probe()
    p, L = args.prefix, args.cand_len
    rows, records, worst = [], [], 0.0
    for n in [int(x) for x in args.candidates.split(",")]:
        pre, cands = prompts(args.users, n, p, L, seed=n)
        useful = flops(shape, p + n * L, p * p + n * L * (p + L))  # per user, prefix once
        fns = {"(a) hf-pairs": lambda pre=pre, cands=cands: fanout(model, pre, cands,
                                                                   args.batch, hf),
               "(b) fanout": lambda pre=pre, cands=cands: fanout(model, pre, cands, args.batch),
               "(c) prefix-once": lambda pre=pre, cands=cands: model(pre, cands)}
        times, results = {}, {}
        with torch.inference_mode():
            for name, fn in fns.items():
                timing, results[name] = cm.time_fn(fn, args.repeats)
                times[name] = timing.best / args.users
        diff = max(float((a - b).abs().max()) for a, b in
                   zip(results["(b) fanout"], results["(c) prefix-once"], strict=True))
        worst = max(worst, diff)
        peak = tracker.probe()["float32 torch.mm"]
        for name, t in times.items():
            done = flops(shape, n * (p + L), n * (p + L) ** 2) if "prefix" not in name else useful
            gflops = done / t / 1e9
            rows.append([name, str(n), f"{t:.3f}", f"{n / t:.0f}",
                         f"{times[name] / times['(c) prefix-once']:.2f}x",
                         f"{gflops:.0f}", f"{100 * gflops / peak:.0f}%"])
            records.append({"method": name, "candidates": n, "seconds_per_user": t,
                            "scores_per_s": n / t, "gflops": gflops, "peak": peak})
        print(f"{n} candidates: max |(b) - (c)| = {diff:.2e}", flush=True)
    print(f"\nMiniLM teacher, prefix {p} tokens, candidates {L} tokens, {args.users} users, "
          f"{args.threads} thread(s); fp32 matmul peak {tracker.summary()}")
    print(cm.format_table(["method", "cands", "s/user", "scores/s", "time vs (c)", "GFLOP/s",
                           "of peak"], rows))
    payload = {"machine": cm.machine_note(), "args": vars(args), "records": records,
               "max_diff": worst}
    return cm.finish(args.json, payload, worst < 1e-4)


if __name__ == "__main__":
    raise SystemExit(main())
