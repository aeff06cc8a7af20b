"""fp32 precision against a float64 run of transformers on the same weights.

The measure: max |genrec - reference| / max(1, max |reference|) over all scores of a call
(the error relative to the score scale), bounded by 1e-5 for label log-probs, summed
log-likelihoods and beam scores, through the native attention kernel and the PyTorch path,
one forward and chunked. CI runs this file under every CPU setting it tests (AVX-512 and
AVX2 caps), so a fast path that loses precision on one kind of CPU turns it red.
"""

from __future__ import annotations

import pytest
import torch

from genrec import Engine, EngineConfig, ScoreParams
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine.params import BeamParams
from genrec.engine.requests import RowRequest, ScoreRequest
from genrec.kernels import cascade_attention_op
from genrec.model import load_model
from genrec.vocab.sid_vocab import SOFT_ID, SidVocab

pytestmark = pytest.mark.numerics

VOCAB, LABELS, TOLERANCE = 1000, [5, 17, 300], 1e-5
SIZES = [8, 6, 5]


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max(1, max |ref|): the error relative to the score scale."""
    got, ref = got.double(), ref.double()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item()


@pytest.fixture(scope="module", params=[1, 3], ids=["1-layer", "3-layer"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(path, float64 transformers model): a tiny Qwen3 whose weights are bf16 values."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(request.param)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
        num_hidden_layers=request.param, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=2048))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name == "lm_head.weight":
                p.mul_(20)  # logits of a few units, as a trained model has
            p.copy_(p.bfloat16().float())
    path = tmp_path_factory.mktemp(f"numerics{request.param}")
    model.eval().save_pretrained(path)
    return path, model.double()


@pytest.fixture(params=["kernel", "pytorch"])
def attention_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The native CPU attention kernel, or the PyTorch path (as GENREC_CPU_KERNELS=0)."""
    if request.param == "kernel":
        if cascade_attention_op() is None:
            pytest.skip("the native kernel cannot be built here (no compiler or BLAS)")
    else:
        monkeypatch.setattr("genrec.model.attention.cascade_attention_op", lambda: None)
    return request.param


def _requests() -> list[ScoreRequest]:
    g = torch.Generator().manual_seed(7)
    out = []
    for n_prefix in (40, 53):
        prefix = torch.randint(0, VOCAB, (n_prefix,), generator=g).tolist()
        lens = torch.randint(1, 6, (24,), generator=g).tolist()
        out.append(ScoreRequest(prefix, [torch.randint(0, VOCAB, (n,), generator=g).tolist()
                                         for n in lens]))
    return out


def _reference_logprobs(ref, tokens: list[int]) -> torch.Tensor:  # noqa: ANN001
    with torch.no_grad():
        return torch.log_softmax(ref(torch.tensor([tokens])).logits[0], -1)  # [L, V] fp64


@pytest.mark.parametrize("chunk_tokens", [4096, 16], ids=["one-forward", "chunked"])
@pytest.mark.parametrize("mode", ["labels", "loglik"])
def test_scores_equal_float64(checkpoint, attention_path: str, mode: str,
                              chunk_tokens: int) -> None:
    path, ref = checkpoint
    engine = Engine(load_model(path), config=EngineConfig(chunk_tokens=chunk_tokens))
    params = ScoreParams(mode=mode, label_token_ids=LABELS if mode == "labels" else None)
    requests = _requests()
    got, want = [], []
    for request, scores in zip(requests, engine.score_requests(requests, params), strict=True):
        for cand, score in zip(request.candidates, scores, strict=True):
            logp = _reference_logprobs(ref, request.prefix + cand)
            n = len(request.prefix)
            if mode == "labels":
                want.append(logp[-1, LABELS])
            else:
                want.append(logp[n - 1 : -1].gather(1, torch.tensor(cand)[:, None]).sum()[None])
            got.append(torch.as_tensor(score).reshape(-1))
    assert relative_error(torch.cat(got), torch.cat(want)) < TOLERANCE


def _check_beam_scores(model, ref, seed: int, requests: list[RowRequest]) -> None:  # noqa: ANN001
    """A beam search of width 16 over 60 random items: every returned score within
    :data:`TOLERANCE` of the float64 reference's log-probability of the item's IDs."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    index = SemanticIndex(codes[torch.randperm(codes.shape[0], generator=g)[:60]], SIZES)
    vocab = SidVocab(index, max_history=8)
    engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID), vocab=vocab)
    recs = engine.recommend_rows(requests, BeamParams(beam_width=16, n=8))
    got, want = [], []
    for request, rec in zip(requests, recs, strict=True):
        prompt = vocab.prompt(request.history)
        for item, score in zip(rec.items, rec.scores, strict=True):
            tokens = vocab.item_tokens([item])[0].tolist()
            logp = _reference_logprobs(ref, prompt + tokens)
            n = len(prompt)
            want.append(logp[n - 1 : -1].gather(1, torch.tensor(tokens)[:, None]).sum())
            got.append(torch.tensor(score))
    assert len(got) == 16
    assert relative_error(torch.stack(got), torch.stack(want)) < TOLERANCE


def test_beam_scores_equal_float64(checkpoint, attention_path: str) -> None:
    path, ref = checkpoint
    _check_beam_scores(load_model(path), ref, 3,
                       [RowRequest(history=[3, 17, 8, 40]), RowRequest(history=[59])])


# --- checkpoints stored in bf16, as published ones are, scored in fp32 --------------------------

STORED_BF16 = ["Qwen3-0.6B", "Llama-3.2-1B", "Qwen2.5-0.5B"]


@pytest.fixture(scope="module", params=STORED_BF16)
def bf16_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(path, float64 transformers model): a published layout (3 layers, MLP 160, every norm
    weight U(0.5, 1.5), biases where the layout has them), saved by ``save_pretrained`` after
    ``.to(torch.bfloat16)`` (bf16 tensors, ``dtype: bfloat16``), the reference read back from
    those files in float64."""
    import json

    from hf_layouts import hf_model, published, randomise
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tmp_path_factory.mktemp(f"bf16-{request.param}")
    config = published(request.param) | {"intermediate_size": 160, "num_hidden_layers": 3}
    (path / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                             dtype=torch.float32)
    randomise(model, seed=STORED_BF16.index(request.param))
    model.to(torch.bfloat16).eval().save_pretrained(path)
    stored = json.loads((path / "config.json").read_text())
    assert (stored.get("dtype") or stored.get("torch_dtype")) == "bfloat16"
    return path, hf_model(path, torch.float64)


@pytest.fixture(params=["detected", "avx2"])
def cpu_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The CPU as genrec detects it, or genrec's detection overridden to an AVX2-only CPU (no
    AVX-512, no bf16 instructions: the choices genrec makes on such a CPU; the native kernel's
    AVX2 build is CI's capped run)."""
    if request.param == "avx2":
        from dataclasses import replace

        from genrec.utils import cpu

        if cpu.cpu_features().level in ("baseline", "avx2"):
            pytest.skip("this CPU is (or is capped to) AVX2 or less: 'detected' is that run")

        avx2 = replace(cpu.detect_cpu(), avx512=False, avx512_bf16=False, amx_bf16=False,
                       onednn_bf16=False)
        monkeypatch.setattr(cpu, "cpu_features", lambda: avx2)
        assert not cpu.bf16_products_native()
    return request.param


@pytest.mark.parametrize("mode", ["labels", "loglik"])
def test_bf16_stored_checkpoint_scores_in_fp32(bf16_checkpoint, cpu_kind: str,
                                               mode: str) -> None:
    path, ref = bf16_checkpoint
    engine = Engine.from_pretrained(path, dtype=torch.float32)
    assert engine.model.dtype == torch.float32
    params = ScoreParams(mode=mode, label_token_ids=LABELS if mode == "labels" else None)
    g = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, VOCAB, (37,), generator=g).tolist()
    cands = [torch.randint(0, VOCAB, (int(n),), generator=g).tolist()
             for n in torch.randint(1, 10, (40,), generator=g)]
    scores = engine.score(prefix, cands, params)
    got, want = [], []
    for cand, score in zip(cands, scores, strict=True):
        logp = _reference_logprobs(ref, prefix + cand)
        if mode == "labels":
            want.append(logp[-1, LABELS])
        else:
            want.append(logp[len(prefix) - 1 : -1].gather(1, torch.tensor(cand)[:, None])
                        .sum()[None])
        got.append(torch.as_tensor(score).reshape(-1))
    assert relative_error(torch.cat(got), torch.cat(want)) < TOLERANCE


def test_bf16_stored_checkpoint_beam_scores_in_fp32(bf16_checkpoint, cpu_kind: str) -> None:
    path, ref = bf16_checkpoint
    _check_beam_scores(load_model(path, dtype=torch.float32), ref, 5,
                       [RowRequest(history=[3, 17, 8, 40]),
                        RowRequest(history=[59, 2])])
