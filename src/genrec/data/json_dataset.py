"""The JSON dataset format of LC-Rec / LETTER / CollisionGenRec: ``<Name>.inter.json`` ({user:
[item ids]} in time order), ``<Name>.item.json`` ({item id: {field: text}}) and
``sid-rqvae/<Name>.index.json`` (each item's Semantic-ID tokens)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrec.data.dataset import Dataset, id_listing, sorted_ids, text_fields


@dataclass(frozen=True)
class JsonDatasetFiles:
    """Paths of one dataset in the JSON format; ``items`` and ``semantic_ids`` may be absent."""

    name: str
    interactions: Path
    items: Path | None
    semantic_ids: Path | None


def find_json_dataset(folder: str | Path, name: str | None = None) -> JsonDatasetFiles:
    """Locate ``<Name>.inter.json``, ``<Name>.item.json`` and ``sid-rqvae/<Name>.index.json``.

    ``name`` selects the dataset when the folder holds several ``*.inter.json`` files.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {folder}")
    if name is None:
        found = sorted(folder.glob("*.inter.json"))
        if not found:
            raise FileNotFoundError(f"no '<Name>.inter.json' file in {folder}")
        if len(found) > 1:
            names = [p.name for p in found]
            raise ValueError(f"several interaction files in {folder}: {names}; pass name=")
        name = found[0].name[: -len(".inter.json")]
    inter = folder / f"{name}.inter.json"
    if not inter.is_file():
        raise FileNotFoundError(f"interactions file not found: {inter}")
    items = folder / f"{name}.item.json"
    sids = folder / "sid-rqvae" / f"{name}.index.json"
    return JsonDatasetFiles(
        name=name,
        interactions=inter,
        items=items if items.is_file() else None,
        semantic_ids=sids if sids.is_file() else None,
    )


def load_json_dataset(folder: str | Path, name: str | None = None) -> Dataset:
    """Load a dataset in the JSON format from ``folder`` (see :func:`find_json_dataset`).

    The item catalog is the union of the items in the interactions, the item text file and the
    Semantic-ID file, so that ``load_sid_index(ds.semantic_id_path, ds.item_index)`` aligns.
    """
    files = find_json_dataset(folder, name)
    with open(files.interactions) as f:
        inter = json.load(f)
    if not isinstance(inter, dict):
        raise ValueError(f"{files.interactions}: expected an object {{user: [item ids]}}")
    raw_text: dict[str, Any] = {}
    if files.items is not None:
        with open(files.items) as f:
            raw_text = json.load(f)
        if not isinstance(raw_text, dict):
            raise ValueError(f"{files.items}: expected an object {{item id: {{field: text}}}}")

    seqs_raw: dict[str, list[str]] = {}
    for user, items in inter.items():
        if not isinstance(items, list):
            raise ValueError(f"{files.interactions}: user {user!r} has no item list")
        seqs_raw[str(user)] = [str(i) for i in items]
    all_items = [i for s in seqs_raw.values() for i in s]
    if files.items is not None:
        unknown = sorted_ids(set(all_items) - set(raw_text.keys()))
        if unknown:
            raise ValueError(
                f"{files.interactions}: {len(unknown)} item ids missing from {files.items.name}: "
                f"{id_listing(unknown)}"
            )
    sid_items: list[str] = []
    if files.semantic_ids is not None:
        with open(files.semantic_ids) as f:
            sid_items = [str(k) for k in json.load(f)]
    item_ids = sorted_ids([*all_items, *map(str, raw_text.keys()), *sid_items])
    item_index = {iid: i for i, iid in enumerate(item_ids)}
    user_ids = sorted_ids(seqs_raw.keys())
    sequences = [[item_index[i] for i in seqs_raw[u]] for u in user_ids]
    item_text = None
    if files.items is not None:
        item_text = {
            item_index[str(k)]: text_fields(v if isinstance(v, dict) else {"title": v})
            for k, v in raw_text.items()
        }
    return Dataset(
        name=files.name,
        sequences=sequences,
        user_ids=user_ids,
        item_ids=item_ids,
        item_index=item_index,
        item_text=item_text,
        semantic_id_path=files.semantic_ids,
    )
