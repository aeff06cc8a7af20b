"""Shared fixtures: tiny randomly initialised HF checkpoints built with transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# The serving tests' server fixtures (engine, full, bare) live in serving_support.py.
pytest_plugins = ["serving_support"]

# Unit tests run tiny tensors: one thread avoids OpenMP spin contention on small CPUs.
torch.set_num_threads(1)


def make_hf_checkpoint(path: Path, arch: str = "qwen3", tie: bool = False, vocab: int = 128,
                       seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    kwargs = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tie,
        max_position_embeddings=2048,
    )
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**kwargs))
    else:
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    # Random (not near-zero) norms so the test exercises every weight.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.eval().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_checkpoint(tmp_path_factory.mktemp("llama"), "llama", tie=True)


@pytest.fixture
def cpu_isa(monkeypatch: pytest.MonkeyPatch):
    """Caps genrec's CPU detection for one test: ``cpu_isa("avx2")`` (GENREC_CPU_ISA)."""
    from genrec.utils.cpu import cpu_features

    def cap(level: str) -> None:
        monkeypatch.setenv("GENREC_CPU_ISA", level)
        cpu_features.cache_clear()

    yield cap
    monkeypatch.delenv("GENREC_CPU_ISA", raising=False)
    cpu_features.cache_clear()


@pytest.fixture(params=["native", "torch"])
def attention_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through the native CPU kernels (attention, and the decoder layers in one
    call) and through the PyTorch path."""
    from genrec.kernels import cascade_attention_op
    from genrec.model import attention

    if request.param == "torch":
        monkeypatch.setattr(attention, "cascade_attention_op", lambda: None)
        monkeypatch.setenv("GENREC_NATIVE_LAYERS", "0")
    elif cascade_attention_op() is None:
        pytest.skip("the native CPU kernel is not built here (no C++ compiler or MKL)")
    return request.param
