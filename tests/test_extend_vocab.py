"""Semantic IDs appended to a pretrained LM's vocabulary: rows kept, tokenizer kept, training on
mixed text + Semantic-ID prompts, level-normalised beam search (serving and the command:
``test_extend_vocab_serving.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from extend_vocab_support import (
    N_ITEMS,
    SIZES,
    TEXT,
    extended_model,
    make_index,
    titles,
    write_checkpoint,
)

from genrec import BeamParams, Engine, EngineConfig
from genrec.catalog.embeddings import bundled_model_path
from genrec.engine import RowRequest
from genrec.model import ModelConfig, build_model
from genrec.model.checkpoint import load_model, save_model
from genrec.model.layout import build_layout
from genrec.training.extend_vocab import (
    TOKENIZER_FILES,
    encode_text,
    extend_pretrained,
    level_loss,
    load_text_tokenizer,
    start_extended,
)
from genrec.training.generative_loss import batch_loss
from genrec.training.generative_task import GenerativeTask
from genrec.training.windows import IGNORE, window_tokens
from genrec.vocab.sid_vocab import NUM_SPECIAL, SidVocab


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pretrained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("lm"), request.param)


@pytest.fixture(scope="module")
def extended(pretrained: Path) -> tuple[torch.nn.Module, SidVocab]:
    return extended_model(pretrained)


def test_text_rows_kept_sid_rows_appended_tokenizer_kept(pretrained: Path, tmp_path: Path
                                                         ) -> None:
    old = load_model(pretrained)
    n_text = old.config.vocab_size
    model, vocab, files = start_extended(pretrained, make_index(), max_history=4,
                                         prompt_text=TEXT)
    assert (vocab.text_vocab, vocab.bos_id, vocab.soft_id, vocab.pad_id, vocab.base) == (
        n_text, n_text, n_text + 1, n_text + 2, n_text + NUM_SPECIAL)
    assert model.config.vocab_size == n_text + NUM_SPECIAL + sum(SIZES)
    assert model.config.sid_normalize == "level"
    emb = model.model.embed_tokens.weight
    assert torch.equal(emb[:n_text], old.model.embed_tokens.weight)  # bit for bit
    assert torch.equal(model.lm_head.weight[:n_text], old.lm_head.weight)
    assert (model.lm_head.weight is emb) == old.config.tie_word_embeddings
    for name, a in old.state_dict().items():  # every other weight as it was
        if "embed_tokens" not in name and "lm_head" not in name:
            assert torch.equal(model.state_dict()[name], a), name
    mean = old.model.embed_tokens.weight.mean(dim=0)
    assert (emb[n_text:] - mean).abs().max() < 0.01  # the mean, slightly perturbed
    tok = load_text_tokenizer(pretrained)
    assert list(vocab.text_ids) == encode_text(tok, TEXT) and vocab.text_ids
    # saved with the run: weights, layout, tokenizer; all read back
    task = GenerativeTask(vocab, [[0, 1, 2]], extra_files=files, progress=False)
    save_model(model, tmp_path)
    task.save_extra(tmp_path)
    assert {n for n in TOKENIZER_FILES if (pretrained / n).is_file()} <= set(files)
    for name, data in files.items():
        assert (tmp_path / name).read_bytes() == data
    assert load_text_tokenizer(tmp_path).encode(TEXT) == tok.encode(TEXT)
    again = SidVocab.load(tmp_path)
    assert (again.base, again.soft_id, again.text_ids) == (vocab.base, vocab.soft_id,
                                                          vocab.text_ids)
    assert load_model(tmp_path).config.sid_normalize == "level"


def test_text_init_is_the_mean_of_the_items_title_vectors(pretrained: Path) -> None:
    old = load_model(pretrained)
    tok = load_text_tokenizer(pretrained)
    index = make_index()
    tokens = [encode_text(tok, titles()[i]["title"]) for i in range(N_ITEMS)]
    model, vocab = extend_pretrained(old, index, 4, item_tokens=tokens, jitter=0.0)
    rows = old.model.embed_tokens.weight
    vectors = torch.stack([rows[t].mean(dim=0) for t in tokens])
    code = 2  # level 1, code 2: the mean of the items holding it
    holders = index.codes[:, 1] == code
    want = vectors[holders].mean(dim=0)
    got = model.model.embed_tokens.weight[vocab.level_offsets[1] + code]
    torch.testing.assert_close(got, want)


def test_training_on_mixed_prompts(extended: tuple) -> None:
    model, vocab = extended
    model = build_model(model.config)
    model.load_state_dict(extended[0].state_dict())
    tok = load_text_tokenizer(bundled_model_path())
    seqs = [[(u * 3 + j) % N_ITEMS for j in range(6)] for u in range(12)]
    texts = [encode_text(tok, f"user {u} likes optics") for u in range(12)]
    ids, labels, _ = window_tokens(vocab, seqs[0][:3], False, texts[0])
    head = [vocab.bos_id, *texts[0]]
    assert ids[: len(head)] == head  # bos, the text, then the Semantic IDs
    assert all(t == IGNORE for t in labels[: len(head) + vocab.num_levels - 1])
    task = GenerativeTask(vocab, seqs, texts=texts, batch_tokens=10_000, progress=False)
    batch = next(iter(task.batches(0)))
    # the loss is the cross-entropy over each target's level, computed from the level's rows
    loss = batch_loss(model, batch, vocab)
    from genrec.engine.inputs import PackedInputs, build_input_embeds

    inputs = PackedInputs(batch.token_ids, torch.zeros(0, dtype=torch.long), None,
                          batch.soft_rows, None)
    layout = build_layout(batch.lengths, [], [])
    hidden = model(build_input_embeds(model.model.embed_tokens, inputs, None, None),
                   layout.positions, layout)
    rows = batch.labels != IGNORE
    full = model.logits(hidden[rows])
    ref = []
    for t, lab in zip(full, batch.labels[rows].tolist(), strict=True):
        level = max(v for v, off in enumerate(vocab.level_offsets) if lab >= off)
        off = vocab.level_offsets[level]
        ref.append(-F.log_softmax(t[off : off + SIZES[level]], dim=0)[lab - off])
    torch.testing.assert_close(loss, torch.stack(ref).mean(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="vocab"):
        batch_loss(model, batch)
    with pytest.raises(ValueError, match="not Semantic-ID tokens"):
        level_loss(model, hidden[:2], torch.tensor([0, vocab.base]), vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(15):
        for b in task.batches(0):
            opt.zero_grad()
            step = batch_loss(model, b, vocab)
            step.backward()
            opt.step()
            first = first if first is not None else step.item()
    assert step.item() < 0.85 * first  # it learns


def reference_scores(model: torch.nn.Module, vocab: SidVocab, prompt: list[int],
                     items: list[int]) -> torch.Tensor:
    """Summed per-level log-softmax over each level's codes, by one plain forward per item."""
    out = []
    for item in items:
        tokens = vocab.item_tokens([item])[0].tolist()
        ids = torch.tensor(prompt + tokens)
        layout = build_layout([len(ids)], [], [])
        hidden = model(model.model.embed_tokens(ids), layout.positions, layout)
        total = 0.0
        for level, t in enumerate(tokens):
            off, size = vocab.level_offsets[level], SIZES[level]
            logits = hidden[len(prompt) - 1 + level] @ model.lm_head.weight[off : off + size].T
            total += float(F.log_softmax(logits, dim=0)[t - off])
        out.append(total)
    return torch.tensor(out)


def test_beam_search_normalises_over_the_level_codes(extended: tuple) -> None:
    model, vocab = extended
    engine = Engine(model, config=EngineConfig(soft_token_id=vocab.soft_id), vocab=vocab)
    text = encode_text(load_text_tokenizer(bundled_model_path()), "a telescope for my son")
    history = [3, 17, 8]
    with torch.inference_mode():
        [rec] = engine.recommend_rows([RowRequest(history, text=text)],
                                 BeamParams(beam_width=64, n=10))
        [default] = engine.recommend_rows([RowRequest(history)], BeamParams(beam_width=64, n=5))
        prompt = vocab.prompt(history, text=text)
        ref = reference_scores(model, vocab, prompt, list(range(N_ITEMS)))
        ref_default = reference_scores(model, vocab, vocab.prompt(history), list(range(N_ITEMS)))
    assert all(0 <= i < N_ITEMS for i in rec.items) and len(set(rec.items)) == 10
    # width >= catalog: the exact top 10 under level normalisation, with its scores
    top = ref.topk(10)
    assert rec.items == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(rec.scores), top.values, rtol=1e-4, atol=1e-4)
    assert default.items == ref_default.topk(5).indices.tolist()  # the default text: TEXT
    assert vocab.prompt(history)[1 : 1 + len(vocab.text_ids)] == list(vocab.text_ids)


def test_beam_steps_never_compute_the_text_rows(extended: tuple, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    model, vocab = extended
    engine = Engine(model, config=EngineConfig(soft_token_id=vocab.soft_id), vocab=vocab)
    seen: list[tuple[int, int]] = []
    inner = model.range_logits

    def range_logits(hidden: torch.Tensor, offset: int, size: int) -> torch.Tensor:
        seen.append((offset, size))
        return inner(hidden, offset, size)

    def refuse(*args: object) -> None:
        raise AssertionError("the full-vocabulary head was computed")

    monkeypatch.setattr(model, "range_logits", range_logits)
    for name in ("log_normalizer", "logits", "range_logprobs"):
        monkeypatch.setattr(model, name, refuse)
    with torch.inference_mode():
        [rec] = engine.recommend_rows([RowRequest([1, 2])], BeamParams(beam_width=8, n=4))
    assert len(rec.items) == 4
    assert [size for _, size in seen] == SIZES  # one level's codes per step, nothing else
    assert all(offset >= vocab.base for offset, _ in seen)


def test_recommend_rejects_text_on_a_sid_only_model() -> None:
    vocab = SidVocab(make_index(), max_history=4)
    cfg = ModelConfig(vocab_size=vocab.vocab_size, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=8, max_position_embeddings=64)
    engine = Engine(build_model(cfg), vocab=vocab)
    with pytest.raises(ValueError, match=r"requests\[0\]\.text: this model has no text"):
        engine.recommend_rows([RowRequest([1], text=[5])])
    with pytest.raises(ValueError, match="text_ids: 9 is not a text token id"):
        SidVocab.extending(make_index(), 8, text_ids=[9])
