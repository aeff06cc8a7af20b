"""GPU device check: one script, about 5 minutes on one NVIDIA H200 (at most 8 with start-up
and the CUDA tests), every figure in one run; ``--quick``: a smaller plan at the real shapes for
a second try (at most 3 minutes).

Parts (each timed with ``torch.cuda.synchronize()`` around the call on CUDA, plain
``perf_counter`` on the CPU; a failing part or setting, an OOM included, is printed and the
run goes on to the next). Progress is printed as it goes, and with ``--json PATH`` the figures
are written (atomically) after every setting, so a run cut short keeps what it measured:

a. machine (GPU, torch, CUDA) and the matmul peak: TFLOP/s of large square products in bf16,
   fp32 with TF32 off, and TF32 (best of a few, timed with CUDA events);
b. the CUDA tests: ``pytest -q tests/test_cuda.py`` in a subprocess (pass/fail reported);
c. DuoLM scoring: a Qwen3-0.6B-shape ranker (bf16, vocab 151936, tied embeddings), an item
   table of 10,000 items x 2 virtual tokens, one user with a 500-token prefix and 100 / 500
   candidates (2 virtual tokens each), and 8 users x 500 candidates in one call: candidate
   scores/s (best of several calls after warm-up), ``cuda_graphs`` True and False, and TFLOP/s
   (2 x non-embedding params x tokens + attention + the LM head's full row per score) against
   the bf16 peak;
d. beam search: Qwen3-0.6B and Qwen3-1.7B shapes over a vocabulary of 3 specials + 4 x 256
   codes, 1,000,000 random unique 4-level Semantic IDs, width 256, n 10, 1,001-token prompts
   (250 history items): ms per request at batch 1 (median) and requests/s at batch 32,
   ``cuda_graphs`` True against False, and TFLOP/s against the bf16 peak;
e. a summary table, the goals (>= 50,000 scores/s; <= 15 ms per 256-beam request at 1k context
   with the 1.7B shape; graphs >= 3x eager at batch 1) and, with ``--json PATH``, every figure.

Models are random-weight genrec ``DecoderLM`` s built in memory on the device (no transformers,
no checkpoint on disk).

Exit status: 0 when every part ran without an error and the tests passed, 1 otherwise (goals
not met do not change it).

Device run:  ``python bench/gpu.py --json gpu.json``
Second try:  ``python bench/gpu.py --quick --json gpu-quick.json`` (the 1.7B beam shape and one
             scoring setting, a 300,000-item catalog, bf16 peak only, no CUDA tests)
Smoke run:   ``python bench/gpu.py --device cpu --smoke --skip-tests`` (tiny sizes, seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
if importlib.util.find_spec("genrec") is None:  # a bare checkout (no pip install -e .)
    sys.path.insert(0, str(ROOT / "src"))

import common as cm  # noqa: E402

from genrec import (  # noqa: E402
    BeamParams,
    Engine,
    EngineConfig,
    ScoreParams,
    ScoreRequest,
)
from genrec.catalog.item_table import ItemTable  # noqa: E402
from genrec.catalog.semantic_ids import SemanticIndex  # noqa: E402
from genrec.engine import RowRequest  # noqa: E402
from genrec.live_catalog.state import CatalogState  # noqa: E402
from genrec.model import ModelConfig, build_model  # noqa: E402
from genrec.vocab.sid_vocab import SOFT_ID, SidVocab  # noqa: E402

try:  # the DuoLM prompt ids (genrec.duolm pulls in tqdm, which a bare machine may lack)
    from genrec.duolm.prompts import BOS_ID, NO_ID, SEP_ID, YES_ID
except ImportError:
    BOS_ID, SEP_ID, YES_ID, NO_ID = 1, 3, 5, 6

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Sizes


QWEN3_06B = cm.ModelShape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128,
                          intermediate=3072, vocab=151936, tie_embeddings=True)
QWEN3_17B = cm.ModelShape(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                          intermediate=6144, vocab=151936, tie_embeddings=True)
TINY_A = cm.ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                       vocab=512, tie_embeddings=True)
TINY_B = replace(TINY_A, hidden=96, intermediate=192)


@dataclass(frozen=True)
class Sizes:
    """Everything a run's size decides."""

    peak_size: int
    peak_repeats: int
    peak_inner: int
    # scoring
    score_shape: cm.ModelShape
    table_items: int
    k: int
    prefix: int
    score_settings: tuple[tuple[int, int], ...]  # (users, candidates per user)
    score_warmup: int
    score_repeats: int
    # beam search (the vocabulary of each shape is set from the catalog)
    beam_shapes: dict[str, cm.ModelShape]
    catalog_items: int
    levels: int
    codes: int
    width: int
    n: int
    history_items: int
    batches: tuple[int, ...]
    b1_warmup: int
    b1_repeats: int
    bn_warmup: int
    bn_repeats: int
    budget_s: float
    peak_kinds: tuple[str, ...] = ("bfloat16", "float32", "tf32")


FULL = Sizes(
    peak_size=8192, peak_repeats=5, peak_inner=10,
    score_shape=QWEN3_06B, table_items=10_000, k=2, prefix=500,
    score_settings=((1, 100), (1, 500), (8, 500)), score_warmup=3, score_repeats=10,
    beam_shapes={"qwen3-0.6b": QWEN3_06B, "qwen3-1.7b": QWEN3_17B},
    catalog_items=1_000_000, levels=4, codes=256, width=256, n=10, history_items=250,
    batches=(1, 32), b1_warmup=3, b1_repeats=10, bn_warmup=1, bn_repeats=3, budget_s=285,
)
QUICK = Sizes(
    peak_size=8192, peak_repeats=3, peak_inner=10,
    score_shape=QWEN3_06B, table_items=10_000, k=2, prefix=500,
    score_settings=((1, 500),), score_warmup=2, score_repeats=5,
    beam_shapes={"qwen3-1.7b": QWEN3_17B},
    catalog_items=300_000, levels=4, codes=256, width=256, n=10, history_items=250,
    batches=(1, 32), b1_warmup=2, b1_repeats=5, bn_warmup=1, bn_repeats=2, budget_s=150,
    peak_kinds=("bfloat16",),
)
SMOKE = Sizes(
    peak_size=256, peak_repeats=3, peak_inner=2,
    score_shape=TINY_A, table_items=200, k=2, prefix=50,
    score_settings=((1, 10), (1, 40), (2, 40)), score_warmup=1, score_repeats=2,
    beam_shapes={"tiny-0.6b": TINY_A, "tiny-1.7b": TINY_B},
    catalog_items=2000, levels=4, codes=16, width=16, n=5, history_items=10,
    batches=(1, 4), b1_warmup=1, b1_repeats=3, bn_warmup=1, bn_repeats=2, budget_s=60,
)
GOAL_SCORES_PER_S = 50_000
GOAL_MS_PER_REQUEST = 15.0
GOAL_GRAPH_SPEEDUP = 3.0


# ---------------------------------------------------------------------------------------------
# Run state: figures, errors, the time budget


@dataclass
class Run:
    args: argparse.Namespace
    sizes: Sizes
    device: torch.device
    dtype: torch.dtype
    deadline: float
    out: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out.update(errors={}, skipped=[], scoring=[], beam=[], comparisons=[], notes=[])

    def note(self, msg: str) -> None:
        log(f"NOTE: {msg}")
        self.out["notes"].append(msg)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def attempt(self, name: str, fn: Callable[[], Any], min_left_s: float = 0.0) -> Any:
        """Run one part or setting; an exception (an OOM included) is printed and recorded,
        and None returned. Skipped when less than ``min_left_s`` of the budget is left."""
        if self.left() < min_left_s:
            msg = f"{name}: skipped, {self.left():.0f} s of the time budget left"
            log(msg)
            self.out["skipped"].append(msg)
            return None
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - one failure must not lose the other figures
            tail = "".join(traceback.format_exception(err)[-6:])
            log(f"ERROR in {name}: {type(err).__name__}: {err}\n{tail}")
            self.out["errors"][name] = f"{type(err).__name__}: {err}"
            free_memory(self.device)
            return None
        finally:
            self.save()  # each setting's figures (or error) on disk as soon as it ends

    def save(self) -> None:
        """Write the figures so far (after every setting: a killed run keeps what it
        measured)."""
        if self.args.json:
            self.out["total_s"] = round(time.perf_counter() - T0, 1)
            cm.write_json(self.args.json, self.out)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        with contextlib.suppress(Exception):  # after a CUDA fault even this may fail
            torch.cuda.empty_cache()


def timed(fn: Callable[[], Any], device: torch.device, repeats: int,
          warmup: int) -> tuple[list[float], Any]:
    """``warmup`` untimed calls, then ``repeats`` calls each timed with a device
    synchronisation before and after; returns the seconds of each and the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return times, result


GRAPH_SETTINGS = (True, False)  # EngineConfig.cuda_graphs: captured, then the same eagerly


def graphs_label(graphs: bool) -> str:
    return "graphs" if graphs else "eager"


# ---------------------------------------------------------------------------------------------
# Models and FLOPs


def random_model(shape: cm.ModelShape, device: torch.device, dtype: torch.dtype, seed: int,
                 std: float = 0.05, max_positions: int = 4096) -> torch.nn.Module:
    """A random-weight Qwen3 ``DecoderLM`` of ``shape`` built directly on ``device`` (matrices
    N(0, std), norms 1), in ``dtype``."""
    cfg = ModelConfig(
        architecture="Qwen3ForCausalLM", vocab_size=shape.vocab, hidden_size=shape.hidden,
        intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tie_embeddings,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return model.to(dtype).eval()


def params_of(shape: cm.ModelShape) -> tuple[float, float]:
    """(non-embedding parameters, all parameters) of a shape."""
    non_embedding = cm.linear_flops_per_token(shape) / 2
    embed = shape.vocab * shape.hidden * (1 if shape.tie_embeddings else 2)
    return non_embedding, non_embedding + embed


def score_flops(shape: cm.ModelShape, prefix: int, n: int, cand_len: int) -> float:
    """One user's call: prefix + candidates through every layer (an upper bound: the last layer
    runs its MLP for the score rows only), attention over the shared-prefix pairs, and the LM
    head's full row at each score position (the log-softmax needs the whole vocabulary)."""
    tokens = prefix + n * cand_len
    return (cm.linear_flops_per_token(shape) * tokens
            + cm.attention_flops(shape, cm.shared_prefix_pairs(prefix, n, cand_len))
            + 2.0 * shape.hidden * shape.vocab * n)


def beam_flops(shape: cm.ModelShape, prompt: int, width: int, levels: int) -> float:
    """One request's search: the prompt forward (causal attention, its last row's LM head), then
    per further level ``width`` beam tokens through every layer, each attending to the prompt
    and its own earlier codes, and their LM-head rows (full vocabulary: the log-softmax)."""
    lin = cm.linear_flops_per_token(shape)
    head = 2.0 * shape.hidden * shape.vocab
    flops = lin * prompt + cm.attention_flops(shape, prompt * (prompt + 1) / 2) + head
    for level in range(1, levels):
        flops += width * (lin + head) + cm.attention_flops(shape, width * (prompt + level))
    return flops


# ---------------------------------------------------------------------------------------------
# a. machine and matmul peak


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "host": platform.node(),
        "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "genrec": cm._genrec_revision(), "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    sm_count=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}",
                    cudnn=torch.backends.cudnn.version())
        with contextlib.suppress(Exception):
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
            info["nvidia_smi"] = smi.stdout.strip()
    else:
        with contextlib.suppress(OSError):
            names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                     if ln.startswith("model name")]
            info["cpu"] = names[0] if names else platform.processor()
    return info


@contextlib.contextmanager
def fp32_matmul_precision(mode: str) -> Iterator[None]:
    """``highest``: fp32 products in fp32 (TF32 off); ``high``: TF32 allowed."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(mode)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def matmul_tflops(device: torch.device, dtype: torch.dtype, size: int, repeats: int,
                  inner: int) -> float:
    """TFLOP/s of ``size``-cubed products, best of ``repeats`` runs of ``inner`` products (CUDA
    events on a GPU)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    c = torch.empty_like(a)
    for _ in range(3):
        torch.mm(a, b, out=c)
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                torch.mm(a, b, out=c)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / inner
        else:
            t = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b, out=c)
            seconds = (time.perf_counter() - t) / inner
        best = min(best, seconds)
    del a, b, c
    return 2.0 * size**3 / best / 1e12


def part_peak(run: Run) -> None:
    sz, dev = run.sizes, run.device
    peaks: dict[str, float] = {}
    run.out["matmul_peak_tflops"] = peaks
    for name, dtype, mode in (("bfloat16", torch.bfloat16, None),
                              ("float32", torch.float32, "highest"),
                              ("tf32", torch.float32, "high")):
        if name not in sz.peak_kinds:
            continue

        def probe(dtype: torch.dtype = dtype, mode: str | None = mode) -> float:
            with fp32_matmul_precision(mode) if mode else contextlib.nullcontext():
                return matmul_tflops(dev, dtype, sz.peak_size, sz.peak_repeats, sz.peak_inner)

        value = run.attempt(f"peak {name}", probe)
        if value is not None:
            peaks[name] = value
            log(f"matmul peak {name} ({sz.peak_size}^3): {value:.3g} TFLOP/s")
    free_memory(dev)


def peak_of(run: Run) -> float | None:
    return run.out.get("matmul_peak_tflops", {}).get(
        "bfloat16" if run.dtype == torch.bfloat16 else "float32")


def pct(value: float, peak: float | None) -> float | None:
    return 100.0 * value / peak if peak else None


# ---------------------------------------------------------------------------------------------
# b. CUDA tests


def part_tests(run: Run) -> None:
    rec: dict[str, Any] = {"command": "pytest -q tests/test_cuda.py"}
    run.out["tests"] = rec
    if importlib.util.find_spec("pytest") is None:
        rec["status"] = "not run: pytest is not installed"
        log(rec["status"])
        return
    # --noconftest: tests/conftest.py loads the serving fixtures (httpx, fastapi), which a bare
    # GPU machine may lack; tests/test_cuda.py needs none of them
    # (-o addopts=: the project's own -q would make it -qq, without the summary line)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-o", "addopts=", "--noconftest",
           "-p", "no:cacheprovider", "tests/test_cuda.py"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH"))
                                        if p)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=max(30, min(240, run.left())))
    except subprocess.TimeoutExpired as err:
        rec.update(status="FAILED: timed out", seconds=round(time.perf_counter() - start, 1),
                   output_tail=str(err.stdout or "")[-3000:])
        run.out["errors"]["tests"] = "timed out"
        log("tests: timed out")
        return
    output = (done.stdout + done.stderr).strip()
    summary = output.splitlines()[-1] if output else ""
    passed = done.returncode in (0, 5)  # 5: nothing collected (all deselected)
    if passed and run.device.type == "cuda" and " passed" not in summary:
        run.note(f"tests: nothing passed on {run.device} ({summary}): were they all skipped?")
    rec.update(status="passed" if passed else f"FAILED (exit {done.returncode})",
               returncode=done.returncode, summary=summary,
               seconds=round(time.perf_counter() - start, 1), output_tail=output[-4000:])
    if not passed:
        run.out["errors"]["tests"] = f"pytest exit {done.returncode}: {summary}"
    print(output[-6000:] if not passed else "\n".join(output.splitlines()[-25:]), flush=True)
    log(f"tests: {rec['status']}: {summary}")


# ---------------------------------------------------------------------------------------------
# c. DuoLM scoring


def score_setting(run: Run, engine: Engine, graphs: bool, users: list, n_u: int, n: int,
                  prefix_len: int, params: ScoreParams, name: str) -> torch.Tensor:
    """Time one scoring setting (``n_u`` users x ``n`` candidates in one call); returns the
    first user's scores."""
    sz, shape = run.sizes, run.sizes.score_shape
    reqs = [ScoreRequest(prefix=p, candidates=c[:n]) for p, c in users[:n_u]]
    times, result = timed(lambda: engine.score_requests(reqs, params), run.device,
                          sz.score_repeats, sz.score_warmup)
    best, median = min(times), statistics.median(times)
    flops = n_u * score_flops(shape, prefix_len, n, sz.k)
    tflops = flops / best / 1e12
    rec = {"cuda_graphs": graphs, "users": n_u, "candidates_per_user": n,
           "prefix_tokens": prefix_len, "tokens_per_candidate": sz.k,
           "tokens": n_u * (prefix_len + n * sz.k), "scores_per_s": n_u * n / best,
           "seconds_best": best, "seconds_median": median, "seconds_all": times,
           "tflop": flops / 1e12, "tflops": tflops, "pct_peak": pct(tflops, peak_of(run)),
           "finite": all(bool(torch.isfinite(r).all()) for r in result)}
    run.out["scoring"].append(rec)
    log(f"{name}: {rec['scores_per_s']:,.0f} scores/s (best {best * 1e3:.2f} ms, median "
        f"{median * 1e3:.2f} ms), {tflops:.3g} TFLOP/s")
    return result[0].float()


def part_scoring(run: Run) -> None:
    sz, dev, dtype = run.sizes, run.device, run.dtype
    shape = sz.score_shape
    log(f"scoring: building the ranker ({shape.describe()}, {str(dtype)[6:]}) on {dev}")
    model = random_model(shape, dev, dtype, seed=0)
    gen = torch.Generator().manual_seed(1)
    table = ItemTable(0.05 * torch.randn(sz.table_items, sz.k, shape.hidden, generator=gen))

    def tokens(items: list[int]) -> list[int]:
        return [shape.vocab + i * sz.k + j for i in items for j in range(sz.k)]

    n_users = max(u for u, _ in sz.score_settings)
    n_cands = max(n for _, n in sz.score_settings)
    history = (sz.prefix - 2) // sz.k
    users = []
    for _ in range(n_users):
        hist = torch.randperm(sz.table_items, generator=gen)[:history].tolist()
        cands = torch.randperm(sz.table_items, generator=gen)[:n_cands].tolist()
        users.append(([BOS_ID, *tokens(hist), SEP_ID], [tokens([c]) for c in cands]))
    prefix_len = len(users[0][0])
    params = ScoreParams(mode="labels", label_token_ids=[YES_ID, NO_ID])
    log(f"scoring: item table {sz.table_items:,} x {sz.k} virtual tokens, prefix {prefix_len} "
        f"tokens, settings (users x candidates) {list(sz.score_settings)}")
    first: dict[tuple[bool | None, int, int], torch.Tensor] = {}
    for graphs in GRAPH_SETTINGS:
        engine = Engine(model, config=EngineConfig(cuda_graphs=graphs))
        engine.set_item_table(table)
        for n_u, n in sz.score_settings:
            name = f"scoring {graphs_label(graphs)} {n_u}x{n}"
            got = run.attempt(name, functools.partial(
                score_setting, run, engine, graphs, users, n_u, n, prefix_len, params, name),
                min_left_s=5)
            if got is not None:
                first[(graphs, n_u, n)] = got
        engine = None
        free_memory(dev)
    for n_u, n in sz.score_settings:
        a, b = first.get((True, n_u, n)), first.get((False, n_u, n))
        if a is not None and b is not None:
            diff = float((a - b).abs().max())
            run.out["comparisons"].append({"part": "scoring", "users": n_u,
                                           "candidates_per_user": n,
                                           "max_abs_diff_graphs_vs_eager": diff})
            log(f"scoring {n_u}x{n}: graphs vs eager max |diff| {diff:.2e} (first user)")
    del model
    free_memory(dev)


# ---------------------------------------------------------------------------------------------
# d. beam search


def make_catalog(n_items: int, levels: int, codes: int, seed: int) -> SemanticIndex:
    """Random unique Semantic IDs of ``levels`` codes of ``codes`` values (bench/beam.py's
    catalog at any size)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, codes, (int(n_items * 1.1) + 16, levels), generator=g)
    ids = torch.unique(ids, dim=0)
    ids = ids[torch.randperm(ids.shape[0], generator=g)[:n_items]]
    return SemanticIndex(ids, [codes] * levels)


def beam_setting(run: Run, engine: Engine, model_name: str, shape: cm.ModelShape,
                 graphs: bool, requests: list[RowRequest], prompt: int,
                 params: BeamParams, name: str) -> list[list[int]]:
    """Time one beam-search setting (``len(requests)`` requests per call); returns the items
    of each request."""
    sz, b = run.sizes, len(requests)
    warmup, repeats = (sz.b1_warmup, sz.b1_repeats) if b == 1 else (sz.bn_warmup, sz.bn_repeats)
    times, recs = timed(lambda: engine.recommend_rows(requests, params), run.device, repeats,
                        warmup)
    best, median = min(times), statistics.median(times)
    flops = b * beam_flops(shape, prompt, sz.width, sz.levels)
    tflops = flops / best / 1e12
    rec = {"model": model_name, "cuda_graphs": graphs, "batch": b, "beam_width": sz.width,
           "n": sz.n, "prompt_tokens": prompt, "catalog_items": sz.catalog_items,
           "ms_per_request_median": median * 1e3 / b, "ms_per_request_best": best * 1e3 / b,
           "requests_per_s": b / best, "requests_per_s_median": b / median,
           "seconds_all": times, "tflop": flops / 1e12, "tflops": tflops,
           "pct_peak": pct(tflops, peak_of(run)),
           "full_results": all(len(r.items) == sz.n for r in recs)}
    run.out["beam"].append(rec)
    log(f"{name}: {rec['ms_per_request_median']:.2f} ms/request (median), "
        f"{rec['requests_per_s']:.1f} requests/s (best), {tflops:.3g} TFLOP/s")
    return [r.items for r in recs]


def part_beam(run: Run) -> None:
    sz, dev, dtype = run.sizes, run.device, run.dtype
    log(f"beam: catalog of {sz.catalog_items:,} random {sz.levels}-level IDs ({sz.codes} codes "
        "per level)")
    vocab = SidVocab(make_catalog(sz.catalog_items, sz.levels, sz.codes, seed=0),
                     max_history=sz.history_items)
    catalog = CatalogState.build(vocab, dev)
    gen = torch.Generator().manual_seed(2)
    histories = torch.randint(0, sz.catalog_items, (max(sz.batches), sz.history_items),
                              generator=gen).tolist()
    requests = [RowRequest(history=h) for h in histories]
    prompt = len(vocab.prompt(histories[0]))
    params = BeamParams(beam_width=sz.width, n=sz.n)
    log(f"beam: catalog ready; prompts of {prompt} tokens, width {sz.width}, n {sz.n}, "
        f"batches {list(sz.batches)}")
    for model_name, base in sz.beam_shapes.items():
        shape = replace(base, vocab=vocab.vocab_size)
        model = run.attempt(f"beam {model_name} build", functools.partial(
            random_model, shape, dev, dtype, seed=3), min_left_s=10)
        if model is None:
            continue
        log(f"beam {model_name}: {shape.describe()}, {params_of(shape)[1] / 1e9:.2f} B params")
        items: dict[tuple[bool, int], list[list[int]]] = {}
        for graphs in GRAPH_SETTINGS:
            engine = Engine(model, config=EngineConfig(cuda_graphs=graphs, soft_token_id=SOFT_ID))
            engine.set_catalog(catalog)
            for b in sz.batches:
                name = f"beam {model_name} {graphs_label(graphs)} batch {b}"
                got = run.attempt(name, functools.partial(
                    beam_setting, run, engine, model_name, shape, graphs, requests[:b], prompt,
                    params, name), min_left_s=8 if b == 1 else 15)
                if got is not None:
                    items[(graphs, b)] = got
            engine = None
            free_memory(dev)
        for b in sz.batches:
            a, e = items.get((True, b)), items.get((False, b))
            if a is not None and e is not None:
                same = sum(x == y for x, y in zip(a, e, strict=True)) / len(a)
                run.out["comparisons"].append({"part": "beam", "model": model_name, "batch": b,
                                               "items_equal_graphs_vs_eager": same})
                log(f"beam {model_name} batch {b}: graphs vs eager, {100 * same:.0f}% of "
                    "requests with equal top items")
        model = None
        free_memory(dev)


# ---------------------------------------------------------------------------------------------
# e. summary and goals


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def goals(run: Run) -> list[dict[str, Any]]:
    out = []
    default = True
    big = max(run.sizes.score_settings, key=lambda s: (s[0] == 1, s[1]))  # 1 user, most cands
    rec = next((r for r in run.out["scoring"] if r["cuda_graphs"] == default
                and (r["users"], r["candidates_per_user"]) == big), None)
    out.append({"goal": f"scoring, {big[0]} user x {big[1]} candidates: >= "
                        f"{GOAL_SCORES_PER_S:,} candidate scores/s",
                "value": rec["scores_per_s"] if rec else None, "target": GOAL_SCORES_PER_S,
                "met": rec["scores_per_s"] >= GOAL_SCORES_PER_S if rec else None})
    b1 = {(r["model"], r["cuda_graphs"]): r for r in run.out["beam"] if r["batch"] == 1}
    big_model = next((m for m in run.sizes.beam_shapes if m.endswith("1.7b")), None)
    rec = b1.get((big_model, default))
    out.append({"goal": f"beam {big_model}, width {run.sizes.width}, batch 1: <= "
                        f"{GOAL_MS_PER_REQUEST:g} ms per request (median)",
                "value": rec["ms_per_request_median"] if rec else None,
                "target": GOAL_MS_PER_REQUEST,
                "met": rec["ms_per_request_median"] <= GOAL_MS_PER_REQUEST if rec else None})
    for m in run.sizes.beam_shapes:
        g, e = b1.get((m, True)), b1.get((m, False))
        ratio = e["ms_per_request_median"] / g["ms_per_request_median"] if g and e else None
        out.append({"goal": f"beam {m}, batch 1: cuda graphs >= {GOAL_GRAPH_SPEEDUP:g}x eager",
                    "value": ratio, "target": GOAL_GRAPH_SPEEDUP,
                    "met": ratio >= GOAL_GRAPH_SPEEDUP if ratio else None})
    return out


def summary(run: Run) -> None:
    peaks = run.out.get("matmul_peak_tflops", {})
    m = run.out.get("machine", {})
    print("\n" + "=" * 100)
    print(f"machine: {m.get('gpu') or m.get('cpu', '?')}; torch {m.get('torch')}, CUDA "
          f"{m.get('cuda')}; genrec {m.get('genrec')}")
    print("matmul peak TFLOP/s: " + (", ".join(f"{k} {v:.3g}" for k, v in peaks.items())
                                     or "not measured"))
    tests = run.out.get("tests")
    if tests:
        print(f"tests: {tests.get('status')} {tests.get('summary', '')}")
    rows = [[f"{r['users']} x {r['candidates_per_user']}", graphs_label(r["cuda_graphs"]),
             f"{r['scores_per_s']:,.0f}", f"{r['seconds_best'] * 1e3:.2f}",
             f"{r['seconds_median'] * 1e3:.2f}", f"{r['tflops']:.3g}",
             _fmt(r["pct_peak"], ".1f")] for r in run.out["scoring"]]
    if rows:
        print(f"\nDuoLM scoring ({run.sizes.score_shape.describe()}; prefix "
              f"{run.sizes.prefix} tokens, {run.sizes.k} virtual tokens per candidate):")
        print(cm.format_table(["users x cands", "mode", "scores/s", "best ms", "median ms",
                               "TFLOP/s", "% peak"], rows))
    rows = [[r["model"], graphs_label(r["cuda_graphs"]), str(r["batch"]),
             f"{r['ms_per_request_median']:.2f}", f"{r['requests_per_s']:.1f}",
             f"{r['tflops']:.3g}", _fmt(r["pct_peak"], ".1f")] for r in run.out["beam"]]
    if rows:
        print(f"\nBeam search (width {run.sizes.width}, n {run.sizes.n}, "
              f"{run.sizes.catalog_items:,} items, {run.sizes.history_items}-item histories):")
        print(cm.format_table(["model", "mode", "batch", "ms/req (median)", "req/s (best)",
                               "TFLOP/s", "% peak"], rows))
    for c in run.out["comparisons"]:
        print("check: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    run.out["goals"] = goals(run)
    print("\nGoals" + (" (smoke sizes: not meaningful)" if run.args.smoke else "") + ":")
    for g in run.out["goals"]:
        verdict = {True: "MET", False: "NOT MET", None: "not measured"}[g["met"]]
        spec = ",.0f" if g["target"] >= 1000 else ".2f"
        print(f"  {g['goal']}: {_fmt(g['value'], spec)} (target {g['target']:,g}) -> {verdict}")
    for msg in run.out["notes"]:
        print(f"note: {msg}")
    for msg in run.out["skipped"]:
        print(f"skipped: {msg}")
    for name, err in run.out["errors"].items():
        print(f"ERROR {name}: {err}")
    print(f"total {time.perf_counter() - T0:.1f} s")


# ---------------------------------------------------------------------------------------------


PARTS = ("tests", "scoring", "beam")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="a smaller plan at the real shapes (<= 3 minutes on an H200; the "
                           "1.7B beam shape, one scoring setting, no CUDA tests)")
    size.add_argument("--smoke", action="store_true",
                      help="tiny shapes and sizes (seconds; runs on the CPU too)")
    p.add_argument("--skip-tests", action="store_true", help="do not run tests/test_cuda.py")
    p.add_argument("--only", default=None,
                   help=f"comma-separated parts among {', '.join(PARTS)} (the machine and the "
                        "matmul peak are always measured)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--budget-s", type=float, default=None,
                   help="time budget: settings that would start after it are skipped "
                        "(default 285 s, quick 150 s, smoke 60 s)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; 1 for a CPU smoke run)")
    p.add_argument("--json", default=None, help="write every figure to this file")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(PARTS)
    if only - set(PARTS):
        p.error(f"--only: unknown parts {sorted(only - set(PARTS))}; choose from {PARTS}")
    skip_tests = args.skip_tests or args.quick
    args.parts = [x for x in PARTS if x in only and not (x == "tests" and skip_tests)]
    return args


def plan(args: argparse.Namespace) -> Sizes:
    """The sizes a run of ``args`` measures."""
    return SMOKE if args.smoke else QUICK if args.quick else FULL


def plan_name(args: argparse.Namespace) -> str:
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    sizes = plan(args)
    if device.type == "cpu" and (args.threads or args.smoke):
        torch.set_num_threads(args.threads or 1)
    budget = args.budget_s if args.budget_s is not None else sizes.budget_s
    run = Run(args, sizes, device, getattr(torch, args.dtype), T0 + budget)
    run.out["args"] = {k: v for k, v in vars(args).items()}
    run.out["sizes"] = dataclasses.asdict(sizes)
    if device.type == "cuda" and not torch.cuda.is_available():
        log(f"ERROR: --device {args.device} but torch {torch.__version__} sees no CUDA device")
        run.out["errors"]["device"] = "CUDA not available"
        run.save()
        return 1
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    run.out["machine"] = machine_info(device)
    m = run.out["machine"]
    log(f"machine: {m.get('gpu') or m.get('cpu')}; torch {m['torch']}, CUDA {m['cuda']}, "
        f"{m['cpu_cores']} CPU cores; genrec {m['genrec']}; sizes "
        f"{plan_name(args)}, {args.dtype}, budget {budget:.0f} s")
    run.attempt("peak", lambda: part_peak(run))
    run.save()
    for part, fn in (("tests", part_tests), ("scoring", part_scoring), ("beam", part_beam)):
        if part in args.parts:
            log(f"--- {part}")
            run.attempt(part, lambda fn=fn: fn(run), min_left_s=5)
            run.save()
    summary(run)
    run.save()
    if args.json:
        print(f"wrote {args.json}")
    return 1 if run.out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
