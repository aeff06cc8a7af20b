"""Strict loading and saving of Hugging Face checkpoint directories.

A checkpoint is ``config.json`` plus ``*.safetensors`` (one file, or shards with
``model.safetensors.index.json``) in HF naming, so transformers reads what genrec writes and
vice versa. genrec's own additions (soft-token projector, score head) go to
``genrec_extra.safetensors`` beside them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from genrec.model.config import ModelConfig
from genrec.model.registry import build_model
from genrec.utils.atomic import atomic_write, atomic_write_json

EXTRA_FILE = "genrec_extra.safetensors"
INDEX_FILE = "model.safetensors.index.json"
log = logging.getLogger(__name__)
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


def _read_tensors(
    files: list[Path], weight_map: dict[str, str] | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of ``files``; with an index's ``weight_map`` (tensor -> file name) each
    tensor must be in exactly the file the map names, and every mapped tensor present."""
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key in tensors:
                    raise CheckpointError(f"tensor {key!r} appears in more than one file")
                if weight_map is not None and weight_map.get(key) != file.name:
                    where = weight_map.get(key)
                    raise CheckpointError(
                        f"{file}: tensor {key!r} is not in {INDEX_FILE}'s weight_map"
                        if where is None else
                        f"{file}: tensor {key!r} is mapped to {where!r} by {INDEX_FILE}"
                    )
                tensors[key] = f.get_tensor(key)
    absent = sorted(set(weight_map or {}) - set(tensors))
    if absent:
        more = f" ({len(absent) - 1} more tensors likewise)" if len(absent) > 1 else ""
        raise CheckpointError(f"{INDEX_FILE} maps tensor {absent[0]!r} to "
                              f"{weight_map[absent[0]]!r}, which does not hold it{more}")
    return tensors


def _weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files of a checkpoint and its index's weight_map (None without index)."""
    index = path / INDEX_FILE
    if not index.is_file():
        # model.safetensors or its shards (model-00001-of-00002.safetensors, ...); other
        # safetensors files beside them (user vectors, item stores) are not weights
        files = sorted(path.glob("model*.safetensors"))
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors weights")
        return files, None
    if (path / "model.safetensors").is_file():
        # transformers would read model.safetensors alone; a stale index is a trap either way
        raise CheckpointError(f"{path}: both model.safetensors and {INDEX_FILE}; remove one")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({e})") from e
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(f"{index}: weight_map must map tensor names to file names")
    names = sorted(set(weight_map.values()))
    for name in names:
        if Path(name).name != name:
            raise CheckpointError(f"{index}: {name!r} is not a file name in {path}")
        if not (path / name).is_file():
            raise CheckpointError(f"{index}: shard {name!r} does not exist")
    return [path / name for name in names], weight_map


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
        if target.is_floating_point() != src.is_floating_point() or (
                not target.is_floating_point() and src.dtype != target.dtype):
            want = "a floating type" if target.is_floating_point() else str(target.dtype)
            raise CheckpointError(f"{where}: {key} has dtype {src.dtype}, model expects {want}")
    # stored dtypes other than the declared one are cast, as transformers does (said once)
    stored = sorted({str(found[k].dtype) for k in expected if found[k].is_floating_point()}
                    - {str(declared)})
    if declared is not None and stored:
        log.info("%s: tensors stored as %s, config declares %s; cast on load", where,
                 ", ".join(stored), declared)
    with torch.no_grad():
        for key, target in expected.items():
            target.copy_(found[key].to(target.dtype))


def load_model(
    path: str | Path, dtype: str | torch.dtype | None = None, device: str | torch.device = "cpu"
) -> nn.Module:
    """Load a checkpoint directory strictly; missing, unexpected, mis-shaped or non-floating
    tensors, and shards that disagree with their index, raise :class:`CheckpointError`.
    ``dtype`` defaults to the checkpoint's declared one; floating tensors stored in another
    dtype are cast to it (logged once at INFO)."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    raw = json.loads(config_file.read_text())
    declared = parse_dtype(raw.get("dtype") or raw.get("torch_dtype"))
    config = ModelConfig.from_hf_dict(raw)
    files, weight_map = _weight_files(path)
    target_dtype = parse_dtype(dtype) or declared or torch.float32
    model = build_model(config).to(target_dtype)

    state = model.state_dict()
    hf_expected = {k: v for k, v in state.items() if k.startswith(_HF_PREFIXES)}
    extra_expected = {k: v for k, v in state.items() if not k.startswith(_HF_PREFIXES)}
    found = _read_tensors(files, weight_map)
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
    _remove_stale_shards(path)
    if extra:
        atomic_write(path / EXTRA_FILE, lambda t: save_file(extra, t))
    else:  # an earlier model's extras would not match this one
        (path / EXTRA_FILE).unlink(missing_ok=True)
    atomic_write_json(path / "config.json", {**config.to_hf_dict(), "dtype": dtype_name})


def _remove_stale_shards(path: Path) -> None:
    # a sharded checkpoint saved over: its index and the shards it names go (after the new
    # model.safetensors is in place), so the directory holds one set of weights
    index = path / INDEX_FILE
    if not index.is_file():
        return
    try:
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
    except (ValueError, AttributeError):
        shards = set()
    index.unlink()
    for name in shards:
        shard = path / Path(str(name)).name
        if shard.name != "model.safetensors":
            shard.unlink(missing_ok=True)
