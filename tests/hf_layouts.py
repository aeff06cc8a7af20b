"""Published ``config.json`` files of real checkpoints, dimensions shrunk, and tiny
transformers checkpoints built from them.

Every key and value is as published (Hugging Face hub, main branch) except hidden_size 64,
intermediate_size 96, 2 layers, 4 heads / 2 KV heads, head_dim 16 (where the file has one;
otherwise it derives to 64 / 4 = 16) and a vocabulary of 1000.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
VOCAB = TINY["vocab_size"]


def _llama(version: str, factor: float, tie: bool, head_dim: bool) -> dict[str, Any]:
    out = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
        "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 96, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": factor, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": tie, "torch_dtype": "bfloat16",
        "transformers_version": version, "use_cache": True, "vocab_size": 1000,
    }
    if not head_dim:
        del out["head_dim"]
    return out


def _qwen2(bos_eos: tuple[int, int], window_layers: int, window: int, tie: bool,
           version: str, **extra: Any) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": bos_eos[0], "eos_token_id": bos_eos[1], "hidden_act": "silu",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
        "max_position_embeddings": 32768, "max_window_layers": window_layers,
        "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": window, "tie_word_embeddings": tie, "torch_dtype": "bfloat16",
        "transformers_version": version, "use_cache": True, "use_sliding_window": False,
        "vocab_size": 1000, **extra,
    }


def _qwen3(window_layers: int, tie: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
        "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 96, "max_position_embeddings": 40960,
        "max_window_layers": window_layers, "model_type": "qwen3", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": tie, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 1000,
    }


PUBLISHED: dict[str, dict[str, Any]] = {
    "Llama-3.2-1B": _llama("4.45.0.dev0", 32.0, tie=True, head_dim=True),
    "Llama-3.2-3B": _llama("4.45.0.dev0", 32.0, tie=True, head_dim=True),
    "Llama-3.1-8B": _llama("4.43.0.dev0", 8.0, tie=False, head_dim=False),
    "Qwen2.5-0.5B": _qwen2((151643, 151643), 24, 32768, True, "4.40.1", use_mrope=False),
    "Qwen2.5-1.5B-Instruct": _qwen2((151643, 151645), 21, 32768, True, "4.43.1"),
    "Qwen2.5-7B-Instruct": _qwen2((151643, 151645), 28, 131072, False, "4.43.1",
                                  rope_scaling=None),
    "Qwen3-0.6B": _qwen3(28, tie=True),
    "Qwen3-8B": _qwen3(36, tie=False),
}


def published(name: str, original_max: int | None = None) -> dict[str, Any]:
    """A copy of a published config; ``original_max`` replaces a llama3 rope's
    original_max_position_embeddings (small, so short test sequences reach its scaling)."""
    out = copy.deepcopy(PUBLISHED[name])
    if original_max is not None and out.get("rope_scaling"):
        out["rope_scaling"]["original_max_position_embeddings"] = original_max
    return out


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights that matter: linear and embedding weights N(0, 0.1) (attention far from
    uniform, so rotary errors show), norm weights U(0.5, 1.5), biases N(0, 0.5)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def make_checkpoint(path: Path, config: dict[str, Any], seed: int = 0,
                    max_shard_size: str | None = None) -> Path:
    """A transformers checkpoint of ``config`` with random fp32 weights, saved by
    ``save_pretrained`` (sharded with ``max_shard_size``), then ``config.json`` replaced by
    ``config`` itself: the published layout, declaring bfloat16 over fp32 tensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                             dtype=torch.float32)
    randomise(model, seed)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.eval().save_pretrained(path, **kwargs)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def hf_model(path: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' own model of a checkpoint directory, in ``dtype``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def hf_logprobs(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """transformers' log-probabilities [len(ids), vocab] (fp32) after each token of ``ids``."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
