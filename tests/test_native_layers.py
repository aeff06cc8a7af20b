"""The decoder's layers in one native call (CPU fp32 inference): equal to the PyTorch layers
for prompt forwards (with and without a read-out) and beam steps, for every attention variant
(Qwen3 head norms, Qwen2 q/k/v biases, Llama), used only where it applies."""

from __future__ import annotations

import pytest
import torch

import genrec.kernels as kernels
import genrec.model.decoder as decoder
from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.engine.beam import prompt_forward
from genrec.model import ModelConfig, build_model
from genrec.model.beam_step import BeamStepLayout
from genrec.model.kv_cache import KVCache
from genrec.model.native_layers import native_forward
from genrec.vocab.sid_vocab import NUM_SPECIAL, SOFT_ID, SidVocab

pytestmark = pytest.mark.numerics

SIZES = [6, 5, 4]
VARIANTS = {
    "qwen3": {},  # head norms, no biases: the input norm's scale goes to v alone
    "qwen3-biased": {"attention_bias": True},  # head norms and q/k/v/o biases
    "qwen2": {"architecture": "Qwen2ForCausalLM", "qk_norm": False, "qkv_bias": True},
    "llama": {"architecture": "LlamaForCausalLM", "qk_norm": False},
    "llama-biased": {"architecture": "LlamaForCausalLM", "qk_norm": False,
                     "attention_bias": True, "mlp_bias": True},
}


def _needs_op() -> None:
    if kernels.decoder_layers_op() is None:
        pytest.skip("the native CPU kernels are not built here (no C++ compiler or MKL)")


def _model(variant: str, dtype: torch.dtype = torch.float32):  # noqa: ANN202
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=NUM_SPECIAL + sum(SIZES), hidden_size=32, intermediate_size=48,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, max_position_embeddings=256, **VARIANTS[variant])
    model = build_model(cfg).to(dtype)
    with torch.no_grad():
        for p in model.parameters():  # biases and norm weights away from their defaults
            p.add_(0.05 * torch.randn_like(p))
        model.lm_head.weight.mul_(30)
    return model.eval()


def _python_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoder, "native_forward", lambda *args, **kwargs: None)


def _prompt_run(model, lens: list[int]):  # noqa: ANN001, ANN202
    torch.manual_seed(1)
    embeds = torch.randn(sum(lens), model.config.hidden_size)
    last = torch.tensor(lens).cumsum(0) - 1
    cache = KVCache(model.config.num_hidden_layers, len(lens), 64, 0, 1,
                    model.config.num_key_value_heads, model.config.head_dim, model.dtype, "cpu")
    with torch.inference_mode():
        hidden, _ = prompt_forward(model, embeds, lens, last, cache)
    return hidden, cache


@pytest.mark.parametrize("form", ["onednn", "mkl"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prompt_forward_equals_the_pytorch_layers(variant: str, form: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_op()
    monkeypatch.setenv("GENREC_CPU_GEMM", form)  # the native products' weight form
    model = _model(variant)
    lens = [7, 1, 40]  # packed prompts; the last layer for their last rows only
    native, native_cache = _prompt_run(model, lens)
    _python_layers(monkeypatch)
    ref, ref_cache = _prompt_run(model, lens)
    assert (native - ref).abs().max().item() < 1e-4
    for mine, theirs in zip(native_cache.prefix_k + native_cache.prefix_v,
                            ref_cache.prefix_k + ref_cache.prefix_v, strict=True):
        assert (mine - theirs).abs().max().item() < 1e-4


def _engine(variant: str, **config: object) -> Engine:
    g = torch.Generator().manual_seed(0)
    ids = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    index = SemanticIndex(ids[torch.randperm(ids.shape[0], generator=g)[:60]], SIZES)
    return Engine(_model(variant), config=EngineConfig(soft_token_id=SOFT_ID, **config),
                  vocab=SidVocab(index, max_history=12))


REQUESTS = [RowRequest([3, 17, 8]), RowRequest([1]),
            RowRequest(list(range(5, 17)), exclude=[0, 1, 2, 40]),
            RowRequest([20, 21], allow=[4, 9, 30, 31, 55])]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("width", "form"),  # the weight form of the native products
                         [(1, "onednn"), (7, "onednn"), (32, "onednn"), (7, "mkl")])
def test_beam_search_equals_the_pytorch_layers(variant: str, width: int, form: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_op()
    monkeypatch.setenv("GENREC_CPU_GEMM", form)
    calls: list[str] = []

    def counted(*args: object, **kwargs: object) -> torch.Tensor | None:
        out = native_forward(*args, **kwargs)
        calls.append(type(args[3]).__name__ if out is not None else "none")
        return out

    monkeypatch.setattr(decoder, "native_forward", counted)
    native = _engine(variant).recommend_rows(REQUESTS, BeamParams(width, width))
    assert "BeamStepLayout" in calls and "AttentionLayout" in calls and "none" not in calls
    _python_layers(monkeypatch)
    ref = _engine(variant).recommend_rows(REQUESTS, BeamParams(width, width))
    for a, b in zip(native, ref, strict=True):
        assert a.items == b.items
        assert max(abs(x - y) for x, y in zip(a.scores, b.scores, strict=True)) < 1e-4


def test_padding_requests_in_buckets_change_nothing() -> None:
    # bucketed searches pad with requests of no prefix: the native beam attention skips
    # their prefix part
    _needs_op()
    alone = _engine("qwen3").recommend_rows(REQUESTS[:3], BeamParams(8, 8))
    padded = _engine("qwen3", search_request_buckets=(8,)).recommend_rows(REQUESTS[:3],
                                                                     BeamParams(8, 8))
    for a, b in zip(alone, padded, strict=True):
        assert a.items == b.items and a.scores == b.scores


def test_used_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_op()
    model = _model("qwen3")
    cfg = model.config
    cache = KVCache(cfg.num_hidden_layers, 1, 64, 4, 2, cfg.num_key_value_heads, cfg.head_dim,
                    model.dtype, "cpu")
    layout = BeamStepLayout(torch.tensor([5]), torch.arange(4)[:, None].repeat(1, 2), 4, 1, 2)
    embeds = torch.randn(4, cfg.hidden_size)
    with torch.inference_mode():
        assert native_forward(model, embeds, layout.positions(), layout, cache) is not None
        monkeypatch.setenv("GENREC_NATIVE_LAYERS", "0")
        assert native_forward(model, embeds, layout.positions(), layout, cache) is None
        monkeypatch.delenv("GENREC_NATIVE_LAYERS")
        bf16 = _model("qwen3", torch.bfloat16)
        assert native_forward(bf16, embeds.bfloat16(), layout.positions(), layout, cache) is None
    model.train()
    with torch.no_grad():
        assert native_forward(model, embeds, layout.positions(), layout, cache) is None
    model.eval()
    # under autograd with trainable weights: the PyTorch layers (they backpropagate)
    assert native_forward(model, embeds, layout.positions(), layout, cache) is None


def test_bad_tables_raise_instead_of_reading_out_of_bounds() -> None:
    # the kernel checks every row it will read or write before touching memory
    _needs_op()
    model = _model("qwen3")
    cfg = model.config
    cache = KVCache(cfg.num_hidden_layers, 1, 64, 4, 2, cfg.num_key_value_heads, cfg.head_dim,
                    model.dtype, "cpu")
    embeds = torch.randn(4, cfg.hidden_size)
    bad = [BeamStepLayout(torch.tensor([5]), torch.full((4, 2), 9), 4, 1, 2),  # ancestry
           BeamStepLayout(torch.tensor([65]), torch.zeros(4, 2, dtype=torch.long), 4, 1, 2)]
    with torch.inference_mode():
        for layout in bad:
            with pytest.raises(RuntimeError, match="ancestry|prefix_len"):
                native_forward(model, embeds, None, layout, cache)
