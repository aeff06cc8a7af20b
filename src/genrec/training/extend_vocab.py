"""Starting generative retrieval from a pretrained LM: Semantic IDs added to its own vocabulary
(``train generative --init-from DIR --extend-vocab``: :func:`extend_pretrained`), or its first
rows repurposed as a Semantic-ID-only vocabulary (``--init-from DIR``: :func:`adapt_pretrained`).


The checkpoint's ``V`` rows (its text vocabulary, padding rows included) are kept bit for bit,
in the embedding and in the LM head, and its tokenizer files are copied beside every saved
checkpoint. ``bos``, the soft-token placeholder and ``pad`` get three new rows ``V, V+1, V+2``
and the Semantic-ID tokens follow (:meth:`genrec.vocab.sid_vocab.SidVocab.extending`). New rows
start at (``sid_init``):

- ``mean``: the mean of the text rows;
- ``text``: per code of a level, the mean over the items holding that code of the item's text
  vector (the mean of the model's own rows of the item's title tokens); a code no item holds,
  and the special tokens, take the mean;

plus a small seeded perturbation (``jitter`` x the text rows' per-dimension std) so that no two
new rows are equal. With tied embeddings the one matrix is extended.

Such a model normalises each Semantic-ID level over that level's codes only
(``ModelConfig.sid_normalize = "level"``): the training loss (:func:`level_loss`) and the beam
search (``genrec.engine.beam.level_logprobs``) read only the level's rows of the LM head, never
the text vocabulary's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from genrec.catalog.semantic_ids import SemanticIndex
from genrec.model.decoder import DecoderLM
from genrec.model.registry import build_model
from genrec.training.initialization import init_weights
from genrec.vocab.sid_vocab import SidVocab

# the files of a Hugging Face tokenizer folder (whichever of them the checkpoint has)
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja",
)
SID_INITS = ("mean", "text")
TITLE_TOKENS = 32  # an item title's tokens read by ``--sid-init text``


def tokenizer_files(directory: str | Path) -> dict[str, bytes]:
    """The tokenizer files of a checkpoint folder, by name (FileNotFoundError without any)."""
    directory = Path(directory)
    found = {n: (directory / n).read_bytes() for n in TOKENIZER_FILES if (directory / n).is_file()}
    if not found:
        raise FileNotFoundError(f"--init-from: {directory} has no tokenizer files (one of "
                                f"{', '.join(TOKENIZER_FILES[:3])}, ...)")
    return found


def load_text_tokenizer(directory: str | Path) -> Any:
    """The Hugging Face tokenizer of a folder, local files only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def encode_text(tokenizer: Any, text: str, max_tokens: int | None = None) -> list[int]:
    """Text token ids of ``text`` without the tokenizer's own special tokens (the prompt's
    ``bos`` is the vocabulary's), the first ``max_tokens`` of them. Serving encodes a
    completion prompt's text the same way."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return ids[:max_tokens] if max_tokens is not None else ids


def appended_rows(
    text_rows: torch.Tensor, vocab: SidVocab, item_tokens: Sequence[Sequence[int]] | None = None,
    jitter: float = 0.02, seed: int = 0,
) -> torch.Tensor:
    """The new rows after ``text_rows`` [V, H] (specials, then Semantic-ID tokens):
    [vocab.vocab_size - V, H], from the mean, or with ``item_tokens`` (each item's text token
    ids) from the items' text vectors (see the module docstring)."""
    n_text, hidden = text_rows.shape
    if vocab.text_vocab != n_text:
        raise ValueError(f"vocab.text_vocab {vocab.text_vocab} != {n_text} text rows")
    mean = text_rows.mean(dim=0)
    rows = mean.expand(vocab.vocab_size - n_text, hidden).clone()
    if item_tokens is not None:
        n_items = vocab.index.num_items
        if len(item_tokens) != n_items:
            raise ValueError(f"item_tokens: {len(item_tokens)} items, the index has {n_items}")
        flat = torch.tensor([t for ids in item_tokens for t in ids], dtype=torch.long)
        if flat.numel() and not 0 <= int(flat.min()) <= int(flat.max()) < n_text:
            raise ValueError(f"item_tokens: token ids must be text tokens (0..{n_text - 1})")
        owner = torch.repeat_interleave(torch.arange(n_items),
                                        torch.tensor([len(ids) for ids in item_tokens]))
        lengths = torch.bincount(owner, minlength=n_items).to(text_rows.dtype)
        vectors = torch.zeros(n_items, hidden, dtype=text_rows.dtype)
        vectors.index_add_(0, owner, text_rows[flat])
        has_text = lengths > 0
        vectors[has_text] /= lengths[has_text, None]  # [N, H] mean of each item's rows
        tokens = (vocab.item_tokens(torch.arange(n_items))[has_text] - n_text).long()  # [N', L]
        sums = torch.zeros_like(rows)
        counts = torch.zeros(rows.shape[0], dtype=text_rows.dtype)
        for level in range(vocab.num_levels):
            sums.index_add_(0, tokens[:, level], vectors[has_text])
            counts.index_add_(0, tokens[:, level], torch.ones(len(tokens), dtype=counts.dtype))
        held = counts > 0
        rows[held] = sums[held] / counts[held, None]
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(rows.shape, generator=g, dtype=text_rows.dtype)
    return rows + jitter * text_rows.std(dim=0) * noise


def extend_pretrained(
    model: DecoderLM, index: SemanticIndex, max_history: int = 20, user_dim: int = 0,
    text_ids: Sequence[int] = (), item_tokens: Sequence[Sequence[int]] | None = None,
    jitter: float = 0.02, seed: int = 0,
) -> tuple[DecoderLM, SidVocab]:
    """A pretrained decoder (fp32) with the Semantic-ID tokens of ``index`` appended to its
    vocabulary, and that layout (default prompt text ``text_ids``). The model normalises each
    level over its own codes (``sid_normalize="level"``); with ``user_dim`` a fresh soft-token
    projector is added (a checkpoint's own is kept when its size matches)."""

    n_text = model.config.vocab_size
    vocab = SidVocab.extending(index, n_text, max_history, text_ids)
    cfg = dataclasses.replace(model.config, vocab_size=vocab.vocab_size, user_dim=user_dim,
                              sid_normalize="level")
    longest = len(vocab.head(True)) + (max_history + 1) * vocab.num_levels
    if longest > cfg.max_position_embeddings:
        raise ValueError(f"--max-history: a window of {longest} tokens (prompt text included) "
                         f"exceeds the checkpoint's {cfg.max_position_embeddings} positions")
    new = build_model(cfg)
    init_weights(new)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    keys = ["model.embed_tokens.weight"]
    if not cfg.tie_word_embeddings:
        keys.append("lm_head.weight")
    for key in keys:  # the text rows as they are, the new rows after them
        old = state[key]
        state[key] = torch.cat([old, appended_rows(old, vocab, item_tokens, jitter, seed)])
    if cfg.tie_word_embeddings:  # one matrix under both names
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    target = new.state_dict()
    state = {k: v for k, v in state.items() if k in target and v.shape == target[k].shape}
    new.load_state_dict({**target, **state})
    return new, vocab


def item_titles(item_text: Mapping[int, Mapping[str, str]] | None, num_items: int) -> list[str]:
    """Each item's title (its formatted text when it has no title; ``""`` without text)."""
    from genrec.catalog.embeddings import format_item_text

    if item_text is None:
        raise ValueError("--sid-init text: the dataset has no item text")
    return [str(item_text.get(i, {}).get("title") or format_item_text(item_text.get(i, {})))
            for i in range(num_items)]


def start_extended(
    init_from: str | Path, index: SemanticIndex, max_history: int = 20, user_dim: int = 0,
    prompt_text: str | None = None, sid_init: str = "mean",
    item_text: Mapping[int, Mapping[str, str]] | None = None, seed: int = 0,
) -> tuple[DecoderLM, SidVocab, dict[str, bytes]]:
    """``--init-from DIR --extend-vocab``: the checkpoint extended (:func:`extend_pretrained`;
    ``prompt_text`` the default prompt text, ``sid_init`` 'mean' or 'text': from each item's
    title, at most :data:`TITLE_TOKENS` tokens), its layout and its tokenizer files."""
    from genrec.model.checkpoint import load_model

    if sid_init not in SID_INITS:
        raise ValueError(f"--sid-init must be one of {', '.join(SID_INITS)}, got {sid_init!r}")
    files = tokenizer_files(init_from)
    tokenizer = load_text_tokenizer(init_from)
    text_ids = encode_text(tokenizer, prompt_text) if prompt_text else []
    item_tokens = None
    if sid_init == "text":
        item_tokens = [encode_text(tokenizer, title, TITLE_TOKENS)
                       for title in item_titles(item_text, index.num_items)]
    model, vocab = extend_pretrained(load_model(init_from), index, max_history, user_dim,
                                     text_ids, item_tokens, seed=seed)
    return model, vocab, files


def adapt_pretrained(model: DecoderLM, vocab_size: int, user_dim: int = 0) -> DecoderLM:
    """A pretrained decoder resized to the SID vocabulary, in fp32.

    The SID layout reuses token ids ``0 .. vocab_size-1`` (special tokens first, then the SID
    tokens right after them): the embedding and LM-head rows of those ids are kept (their text
    meaning is simply repurposed), the rest are dropped; when the checkpoint has fewer rows, new
    rows start at the mean embedding. With ``user_dim`` a fresh soft-token projector is added.
    """

    cfg = dataclasses.replace(model.config, vocab_size=vocab_size, user_dim=user_dim,
                              sid_normalize="full")
    new = build_model(cfg)
    init_weights(new)
    state = {k: v.float() for k, v in model.state_dict().items()}
    target = new.state_dict()
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        old, rows = state[key], min(vocab_size, state[key].shape[0])
        grown = old.mean(dim=0, keepdim=True).expand(vocab_size - rows, -1)
        state[key] = torch.cat([old[:rows], grown])
    # a checkpoint's own projector is kept only when its user_dim matches
    state = {k: v for k, v in state.items() if k in target and v.shape == target[k].shape}
    new.load_state_dict({**target, **state})
    return new


def level_loss(
    model: DecoderLM, hidden: torch.Tensor, labels: torch.Tensor, vocab: SidVocab
) -> torch.Tensor:
    """Mean cross-entropy of Semantic-ID targets, each over its level's codes only: hidden
    [T, H] and labels [T] (token ids of Semantic-ID tokens) -> scalar. Only the levels' rows
    of the LM head are multiplied (``sid_normalize="level"``, as beam search scores)."""
    weight = model.lm_head.weight
    sizes = vocab.index.codebook_sizes
    total, count = hidden.new_zeros((), dtype=torch.float32), 0
    for offset, size in zip(vocab.level_offsets, sizes, strict=True):
        rows = (labels >= offset) & (labels < offset + size)
        n = int(rows.sum())
        if not n:
            continue
        logits = F.linear(hidden[rows], weight[offset : offset + size]).float()  # [n, size]
        total = total + F.cross_entropy(logits, labels[rows] - offset, reduction="sum")
        count += n
    if count != labels.numel():
        raise ValueError(f"labels: {labels.numel() - count} targets are not Semantic-ID tokens")
    return total / max(count, 1)
