"""Shared by the vocabulary-extension tests: a catalog, item titles, a tiny random Qwen3-shaped
checkpoint over the MiniLM WordPiece vocabulary with its tokenizer, and the extended model.
(Not a test module.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from genrec.catalog.embeddings import bundled_model_path
from genrec.catalog.semantic_ids import SemanticIndex
from genrec.model import ModelConfig, build_model
from genrec.model.checkpoint import save_model
from genrec.training.extend_vocab import TOKENIZER_FILES, load_text_tokenizer, start_extended
from genrec.training.initialization import init_weights
from genrec.vocab.sid_vocab import SidVocab

SIZES = [5, 4, 3]
N_ITEMS = 40
TEXT = "recommend a lab instrument"


def make_index() -> SemanticIndex:
    g = torch.Generator().manual_seed(0)
    all_ids = torch.cartesian_prod(*[torch.arange(k) for k in SIZES])
    return SemanticIndex(all_ids[torch.randperm(all_ids.shape[0], generator=g)[:N_ITEMS]], SIZES)


def titles() -> dict[int, dict[str, str]]:
    words = ["microscope", "beaker", "pipette", "magnet", "telescope"]
    return {i: {"title": f"{words[i % 5]} kit {i}"} for i in range(N_ITEMS)}


def write_checkpoint(folder: Path, tied: bool) -> Path:
    """A random Qwen3-shaped decoder over the MiniLM WordPiece vocabulary, with its tokenizer."""
    torch.manual_seed(0)
    tok = load_text_tokenizer(bundled_model_path())
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, max_position_embeddings=128, tie_word_embeddings=tied)
    model = build_model(cfg)
    init_weights(model)
    save_model(model, folder)
    for name in TOKENIZER_FILES:
        if (bundled_model_path() / name).is_file():
            shutil.copy(bundled_model_path() / name, folder / name)
    return folder


def extended_model(pretrained: Path) -> tuple[torch.nn.Module, SidVocab]:
    """The checkpoint at ``pretrained`` extended over :func:`make_index` (default text
    :data:`TEXT`, SID rows from the item titles), its SID head rows sharpened, in eval mode."""
    model, vocab, _ = start_extended(pretrained, make_index(), max_history=4, prompt_text=TEXT,
                                     sid_init="text", item_text=titles())
    with torch.no_grad():  # sharper level distributions than a fresh init
        model.lm_head.weight[vocab.base:] *= 30
    return model.eval(), vocab
