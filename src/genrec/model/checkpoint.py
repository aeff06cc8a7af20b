"""Strict loading and saving of Hugging Face checkpoint directories.

A checkpoint is ``config.json`` plus ``*.safetensors`` (one file or shards) in HF naming, so
transformers reads what genrec writes and vice versa. genrec's own additions (soft-token
projector, score head) go to ``genrec_extra.safetensors`` beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from genrec.model.config import ModelConfig
from genrec.model.registry import build_model
from genrec.utils.atomic import atomic_write, atomic_write_json

EXTRA_FILE = "genrec_extra.safetensors"
_HF_PREFIXES = ("model.", "lm_head.")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(ValueError):
    """A checkpoint that does not match its model exactly."""


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key in tensors:
                    raise CheckpointError(f"tensor {key!r} appears in more than one file")
                tensors[key] = f.get_tensor(key)
    return tensors


def _check_and_load(
    module: nn.Module, expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor],
    declared: torch.dtype | None, where: str,
) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: missing keys {missing[:10]}{'...' if len(missing) > 10 else ''}, "
            f"unexpected keys {unexpected[:10]}{'...' if len(unexpected) > 10 else ''}"
        )
    for key, target in expected.items():
        src = found[key]
        if tuple(src.shape) != tuple(target.shape):
            raise CheckpointError(
                f"{where}: {key} has shape {tuple(src.shape)}, model expects {tuple(target.shape)}"
            )
        if not src.is_floating_point() or (declared is not None and src.dtype != declared):
            raise CheckpointError(
                f"{where}: {key} has dtype {src.dtype}, checkpoint declares {declared}"
            )
    with torch.no_grad():
        for key, target in expected.items():
            target.copy_(found[key].to(target.dtype))


def load_model(
    path: str | Path, dtype: str | torch.dtype | None = None, device: str | torch.device = "cpu"
) -> nn.Module:
    """Load a checkpoint directory strictly; missing, unexpected, mis-shaped or mis-typed
    tensors raise :class:`CheckpointError`. ``dtype`` defaults to the checkpoint's own."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    raw = json.loads(config_file.read_text())
    declared = parse_dtype(raw.get("dtype") or raw.get("torch_dtype"))
    config = ModelConfig.from_hf_dict(raw)
    # Weights are model.safetensors or its shards (model-00001-of-00002.safetensors, ...);
    # other safetensors files beside them (user vectors, item stores) are not weights.
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights")
    target_dtype = parse_dtype(dtype) or declared or torch.float32
    model = build_model(config).to(target_dtype)

    state = model.state_dict()
    hf_expected = {k: v for k, v in state.items() if k.startswith(_HF_PREFIXES)}
    extra_expected = {k: v for k, v in state.items() if not k.startswith(_HF_PREFIXES)}
    found = _read_tensors(files)
    if config.tie_word_embeddings:
        hf_expected.pop("lm_head.weight", None)
        tied = found.pop("lm_head.weight", None)
        if tied is not None and not torch.equal(tied, found.get("model.embed_tokens.weight")):
            raise CheckpointError(f"{path}: tied embeddings but lm_head.weight differs")
    _check_and_load(model, hf_expected, found, declared, str(path))
    extra_file = path / EXTRA_FILE
    extra_found = _read_tensors([extra_file]) if extra_file.is_file() else {}
    _check_and_load(model, extra_expected, extra_found, None, str(extra_file))
    return model.to(device).eval()


def save_model(model: nn.Module, path: str | Path) -> None:
    """Write ``config.json``, ``model.safetensors`` (HF names) and genrec's extras, each file
    atomically."""
    path = Path(path)
    config: ModelConfig = model.config
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    hf = {k: v for k, v in state.items() if k.startswith(_HF_PREFIXES)}
    extra = {k: v for k, v in state.items() if not k.startswith(_HF_PREFIXES)}
    dtype_name = {v: k for k, v in _DTYPES.items()}[model.dtype]
    atomic_write(path / "model.safetensors", lambda t: save_file(hf, t, metadata={"format": "pt"}))
    if extra:
        atomic_write(path / EXTRA_FILE, lambda t: save_file(extra, t))
    atomic_write_json(path / "config.json", {**config.to_hf_dict(), "dtype": dtype_name})
