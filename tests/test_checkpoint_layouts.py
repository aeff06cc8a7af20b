"""Published checkpoint layouts (Llama 3.x, Qwen2.5, Qwen3; tests/hf_layouts.py) against
transformers: logits in fp32 and bf16, whole and sharded, ``Engine.score``,
``Engine.recommend`` and ``--init-from`` fine-tuning.

The llama3 configs get original_max_position_embeddings 64, and the sequences here reach
past position 64, so llama3's frequency scaling is exercised.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_layouts import PUBLISHED, VOCAB, hf_logprobs, hf_model, make_checkpoint, published

from genrec import BeamParams, Engine, EngineConfig, ScoreParams
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.engine import RowRequest
from genrec.model import build_layout, load_model, save_model
from genrec.training.extend_vocab import adapt_pretrained
from genrec.training.generative_loss import batch_loss
from genrec.training.generative_task import GenerativeTask
from genrec.vocab.sid_vocab import SOFT_ID, SidVocab

NAMES = list(PUBLISHED)
ORIGINAL_MAX = 64
SIZES = [5, 4, 3]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """name, sharded -> a tiny transformers checkpoint of that published layout (the same
    weights whole or sharded)."""
    made: dict[tuple[str, bool], Path] = {}

    def get(name: str, sharded: bool = False) -> Path:
        if (name, sharded) not in made:
            made[name, sharded] = make_checkpoint(
                tmp_path_factory.mktemp(name), published(name, ORIGINAL_MAX),
                seed=NAMES.index(name), max_shard_size="200KB" if sharded else None)
        return made[name, sharded]

    return get


def _logits(model, ids: list[torch.Tensor], lens=None) -> torch.Tensor:  # noqa: ANN001
    # genrec's logits [T, vocab] of sequences packed as plain prefixes, or as prefix +
    # branches when ``lens`` (branches of request 0) is given
    layout = (build_layout([len(s) for s in ids], [], []) if lens is None
              else build_layout([len(ids[0])], [0] * len(lens), lens))
    with torch.no_grad():
        embeds = model.model.embed_tokens(torch.cat(ids))
        return model.logits(model(embeds, layout.positions, layout))


def _hf_logits(hf, seqs: list[torch.Tensor]) -> torch.Tensor:  # noqa: ANN001
    with torch.no_grad():
        return torch.cat([hf(s[None]).logits[0].float() for s in seqs])


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.numerics
@pytest.mark.parametrize("sharded", [False, True], ids=["whole", "sharded"])
@pytest.mark.parametrize("name", NAMES)
def test_fp32_logits_match_transformers(
    checkpoint, name: str, sharded: bool, attention_path: str  # noqa: ANN001
) -> None:
    path = checkpoint(name, sharded)
    assert (path / "model.safetensors.index.json").is_file() == sharded
    ours, hf = load_model(path, dtype="float32"), hf_model(path)
    seqs = [_ids(150, 1), _ids(9, 2)]
    assert (_logits(ours, seqs) - _hf_logits(hf, seqs)).abs().max() < 1e-4
    # one prefix past the llama3 original length with branches: each as if alone after it
    prefix, branches = _ids(100, 3), [_ids(3, 4), _ids(7, 5)]
    got = _logits(ours, [prefix, *branches], [3, 7])
    ref = torch.cat([_hf_logits(hf, [prefix])]
                    + [_hf_logits(hf, [torch.cat([prefix, b])])[100:] for b in branches])
    assert (got - ref).abs().max() < 1e-4


@pytest.mark.numerics
@pytest.mark.parametrize("name", NAMES)
def test_bf16_logits_as_close_as_transformers_bf16(checkpoint, name: str) -> None:  # noqa: ANN001
    path = checkpoint(name)
    ours = load_model(path)  # the declared dtype: bfloat16
    assert ours.dtype == torch.bfloat16
    seqs = [_ids(150, 6)]
    ref = _hf_logits(hf_model(path), seqs)
    hf16 = _hf_logits(hf_model(path, torch.bfloat16), seqs)
    got = _logits(ours, seqs)
    ours_err, hf_err = (got - ref).abs().max(), (hf16 - ref).abs().max()
    assert ours_err <= 1.5 * hf_err + 0.02, (ours_err, hf_err)
    assert (got - hf16).abs().max() <= 2 * hf_err + 0.02


@pytest.mark.parametrize("name", NAMES)
def test_engine_score_matches_transformers_logprobs(checkpoint, name: str) -> None:  # noqa: ANN001
    path = checkpoint(name)
    engine = Engine.from_pretrained(path, dtype="float32")
    hf = hf_model(path)
    prefix = _ids(80, 7).tolist()
    cands = [_ids(n, 8 + n).tolist() for n in (1, 4, 9, 2)]
    labels = engine.score(prefix, cands, ScoreParams("labels", [3, 7]))
    loglik = engine.score(prefix, cands, ScoreParams("loglik"))
    for i, cand in enumerate(cands):
        logp = hf_logprobs(hf, prefix + cand)
        assert (labels[i] - logp[-1, [3, 7]]).abs().max() < 1e-4
        ref = sum(float(logp[len(prefix) - 1 + j, t]) for j, t in enumerate(cand))
        assert abs(float(loglik[i]) - ref) < 1e-4 * max(1.0, abs(ref))


def _vocab(max_history: int = 30) -> SidVocab:
    g = torch.Generator().manual_seed(0)
    codes = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    return SidVocab(SemanticIndex(codes[torch.randperm(len(codes), generator=g)[:40]], SIZES),
                    max_history=max_history)


@pytest.mark.parametrize("name", NAMES)
def test_recommend_scores_are_transformers_logliks(checkpoint, name: str) -> None:  # noqa: ANN001
    path = checkpoint(name)
    vocab = _vocab()
    engine = Engine(load_model(path, dtype="float32"), config=EngineConfig(soft_token_id=SOFT_ID),
                    vocab=vocab)
    hf = hf_model(path)
    history = torch.randint(0, 40, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt = vocab.prompt(history)
    assert len(prompt) > ORIGINAL_MAX
    rec = engine.recommend_rows([RowRequest(history)], BeamParams(beam_width=8, n=5))[0]
    assert len(rec.items) == 5
    for item, score in zip(rec.items, rec.scores, strict=True):
        sid = vocab.item_tokens([item])[0].tolist()
        logp = hf_logprobs(hf, prompt + sid)
        ref = sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(sid))
        assert abs(score - ref) < 1e-4 * max(1.0, abs(ref)), (item, score, ref)


@pytest.mark.parametrize("name", NAMES)
def test_init_from_fine_tunes_and_saves_what_transformers_reads(
    checkpoint, name: str, tmp_path  # noqa: ANN001
) -> None:
    from transformers import AutoModelForCausalLM

    path = checkpoint(name)
    vocab = _vocab(max_history=25)
    model = adapt_pretrained(load_model(path), vocab.vocab_size)  # as genrec train --init-from
    g = torch.Generator().manual_seed(2)
    users = [torch.randint(0, 40, (28,), generator=g).tolist() for _ in range(4)]
    task = GenerativeTask(vocab, users, batch_tokens=200, progress=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch in list(task.batches(0))[:2]:
        loss = batch_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    save_model(model, tmp_path)
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                    output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    original = hf_model(path).config
    assert type(hf.config) is type(original)
    assert hf.config.rope_parameters == original.rope_parameters
    assert hf.config.tie_word_embeddings == original.tie_word_embeddings
    ids = [torch.randint(0, vocab.vocab_size, (120,), generator=g)]
    assert (_logits(model, ids) - _hf_logits(hf.eval(), ids)).abs().max() < 1e-4
    again = load_model(tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
