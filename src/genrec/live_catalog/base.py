"""The base snapshot of a catalog state directory (``base-<version>.pt``, see
:mod:`genrec.live_catalog.log`): the served catalog as of one version.

A base holds the generative catalog as every item's codes (int16, or int32 where a code does
not fit: 10M items of 4 levels are 80 MB) and the retired item ids, enough to rebuild the
``CatalogState`` exactly (``CatalogState.restored``), and the ranker's net change per item id
since the table the ranker loads itself: its last upsert and whether it was retired since
(replayed by :func:`ranker_calls`). It is written with ``torch.save`` and read back with
``weights_only`` (tensors and plain data only).

The same net changes bring the catalogs forward by many logged updates in a few calls
(:func:`install_updates`): the generative catalog's (:func:`net_generative`: each item's last
Semantic ID, the items retired since) and the ranker's (:func:`fold_ranker`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from genrec.live_catalog.log_format import CatalogLogError, scan_log
from genrec.utils.atomic import atomic_write

if TYPE_CHECKING:
    from genrec.catalog.id_map import IdMap
    from genrec.live_catalog.host import CatalogHost, CatalogUpdater

BASE_FORMAT = 1
BASE_NAME = re.compile(r"base-(\d+)\.pt")


@dataclass(frozen=True)
class RankerItem:
    """The ranker's net change of one item: its last upsert (the item without
    ``semantic_id``; ``None``: none logged) and whether it was retired since."""

    data: dict[str, Any] | None
    retired: bool = False


@dataclass(frozen=True)
class GenerativeBase:
    """The generative catalog of a base: every item's codes (CPU int16/int32 [N, L]), the
    codebook sizes, and the retired ids (sorted int64); see ``CatalogState.export``."""

    codes: torch.Tensor
    codebook_sizes: tuple[int, ...]
    retired: torch.Tensor


@dataclass(frozen=True)
class CatalogBase:
    """The catalog as of ``version``: the generative part (``None``: none), the ranker's
    net changes per item row, and the table ids added since the model's (rows N, N+1, ... of
    the id map)."""

    version: int
    generative: GenerativeBase | None
    ranker: Mapping[int, RankerItem] = field(default_factory=dict)
    ids: tuple[str, ...] = ()


def ranker_part(item: dict[str, Any]) -> dict[str, Any] | None:
    """What of an upsert item the ranker takes: the item without ``semantic_id`` when it has
    no ``semantic_id`` or other fields (text, vectors...), else ``None``."""
    if item.get("semantic_id") is not None and not set(item) - {"item_id", "semantic_id"}:
        return None
    return {k: v for k, v in item.items() if k != "semantic_id"}


def fold_ranker(net: Mapping[int, RankerItem], updates: Iterable[tuple[str, list]]
                ) -> dict[int, RankerItem]:
    """``net`` with ``(op, data)`` updates applied: the last upsert of each item wins, a
    retire marks it (a later upsert brings it back)."""
    out = dict(net)
    for op, data in updates:
        if op == "upsert":
            for item in data:
                part = ranker_part(item)
                if part is not None:
                    out[int(item["item_id"])] = RankerItem(part)
        else:
            for i in data:
                old = out.get(int(i))
                out[int(i)] = RankerItem(old.data if old is not None else None, True)
    return out


def ranker_calls(net: Mapping[int, RankerItem]) -> list[tuple[str, list]]:
    """The updater calls that bring the ranker from the table it loads to ``net``: upserts in
    item order, one call per run of items with the same fields (an updater may refuse to mix
    text and vectors in one call; new ids must come in order), then one retire."""
    calls: list[tuple[str, list]] = []
    for i in sorted(net):
        data = net[i].data
        if data is None:
            continue
        if calls and set(calls[-1][1][-1]) == set(data):
            calls[-1][1].append(data)
        else:
            calls.append(("upsert", [data]))
    retired = sorted(i for i, item in net.items() if item.retired)
    return calls + ([("retire", retired)] if retired else [])


def sync_dir(path: Path) -> None:
    """fsync a directory: the renames and removals made in it are durable after this."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_base(directory: Path, base: CatalogBase) -> Path:
    """Write ``base-<version>.pt`` durably (temp file, fsync, rename, fsync of the directory)."""
    gen = base.generative
    data = {"format": BASE_FORMAT, "version": base.version,
            "codes": gen.codes if gen else None, "retired": gen.retired if gen else None,
            "codebook_sizes": list(gen.codebook_sizes) if gen else None,
            "ranker": {int(i): {"data": r.data, "retired": r.retired}
                       for i, r in base.ranker.items()},
            "ids": list(base.ids)}
    path = directory / f"base-{base.version}.pt"
    atomic_write(path, lambda tmp: torch.save(data, tmp))
    sync_dir(directory)
    return path


def read_base(path: Path) -> CatalogBase:
    """A base file (raises :class:`CatalogLogError` when it cannot be read)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        if data["format"] != BASE_FORMAT:
            raise ValueError(f"format {data['format']}, expected {BASE_FORMAT}")
        gen = None
        if data["codes"] is not None:
            gen = GenerativeBase(data["codes"], tuple(data["codebook_sizes"]), data["retired"])
        ranker = {int(i): RankerItem(r["data"], bool(r["retired"]))
                  for i, r in data["ranker"].items()}
        ids = tuple(data.get("ids", ()))
        if not all(isinstance(i, str) for i in ids):
            raise ValueError("ids: not a list of item ids")
        return CatalogBase(int(data["version"]), gen, ranker, ids)
    except Exception as err:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CatalogLogError(f"{path}: not a readable catalog base ({err})") from err


def base_files(directory: Path) -> dict[int, Path]:
    """The base files of a state directory by version."""
    found = (BASE_NAME.fullmatch(p.name) for p in directory.iterdir())
    return {int(m.group(1)): directory / m.group(0) for m in found if m}


def fold_base(directory: Path, log_path: Path, base_version: int | None, version: int,
              offset: int, generative: GenerativeBase | None, ids: tuple[str, ...]) -> None:
    """Write ``base-<version>.pt`` durably: ``generative`` and ``ids`` as of ``version``, and
    the ranker's net change of base ``base_version`` (none: the log's start) with the log's
    records up to byte ``offset`` folded in."""
    scan = scan_log(log_path, offset)
    net = {}
    if base_version is not None:
        net = read_base(base_files(directory)[base_version]).ranker
    done = base_version if base_version is not None else scan.header["after"]
    net = fold_ranker(net, ((r.op, r.data) for _, r in scan.records if r.version > done))
    write_base(directory, CatalogBase(version, generative, net, ids))


def remove_bases_before(directory: Path, version: int) -> None:
    """Remove the bases older than ``version`` (durably: the directory fsynced)."""
    for older, path in base_files(directory).items():
        if older < version:
            path.unlink()
    sync_dir(directory)


def net_generative(updates: Iterable[tuple[str, list]]) -> tuple[dict[int, list[int]], set[int]]:
    """The generative catalog's net change of ``(op, data)`` updates: each item's last
    Semantic ID (of the upserts that gave one) and the items retired since their last one.
    As one ``CatalogState.updated(sids, retired)`` (upserts first, then retires; retired ids
    beyond the catalog were the ranker's alone) it makes the same catalog as the updates."""
    sids: dict[int, list[int]] = {}
    retired: set[int] = set()
    for op, data in updates:
        if op == "retire":
            retired.update(int(i) for i in data)
            continue
        for item in data:
            if item.get("semantic_id") is not None:
                sids[int(item["item_id"])] = list(item["semantic_id"])
                retired.discard(int(item["item_id"]))
    return sids, retired


def replay_ranker(net: Mapping[int, RankerItem], ranker_updater: CatalogUpdater | None,
                  where: str, ids: IdMap | None = None) -> None:
    """Bring the ranker's table to ``net`` through its updater (:func:`ranker_calls`; rows of
    ``ids``, the catalog's id map after it); with no updater, only retired-only items may be
    there (``CatalogLogError`` names ``where``)."""
    for op, data in ranker_calls(net):
        if ranker_updater is not None:
            getattr(ranker_updater, op)(data, ids=ids)
        elif op == "upsert":
            raise CatalogLogError(f"{where}: ranker items, and no ranker updater to take them")


def install_base(base: CatalogBase, engine: CatalogHost, ranker_updater: CatalogUpdater | None,
                 ids: IdMap | None = None) -> None:
    """Bring freshly loaded catalogs to ``base``: the engine's generative catalog replaced by
    the base's (same codebooks), the ranker's net changes replayed through its updater (rows
    of ``ids``, the base's id map).
    Raises :class:`CatalogLogError` when the base does not fit these catalogs."""
    state, gen = engine.catalog, base.generative
    where = f"base-{base.version}.pt"
    if (gen is None) != (state is None):
        has = "has" if gen is not None else "has no"
        raise CatalogLogError(f"{where} {has} generative catalog, unlike this engine")
    if gen is not None:
        if list(gen.codebook_sizes) != state.codebook_sizes:
            raise CatalogLogError(f"{where}: codebook sizes {list(gen.codebook_sizes)}, the "
                                  f"engine's {state.codebook_sizes}")
        engine.set_catalog(state.restored(gen.codes, gen.retired, base.version))
    replay_ranker(base.ranker, ranker_updater, where, ids)


def install_updates(updates: list[tuple[str, list]], version: int, engine: CatalogHost,
                    ranker_updater: CatalogUpdater | None, where: str,
                    ids: IdMap | None = None) -> None:
    """Bring the catalogs forward by logged ``(op, data)`` updates as one net change each
    (:func:`net_generative`, :func:`fold_ranker`): a few calls however many updates there
    are; the generative catalog then has ``version`` (and ``ids``, its id map). Raises
    ``ValueError`` (or :class:`CatalogLogError`) when these catalogs cannot take them."""
    state = engine.catalog
    if state is not None:
        sids, retired = net_generative(updates)
        n = state.num_items + sum(i >= state.num_items for i in sids)
        retire = sorted(i for i in retired if i < n)
        engine.set_catalog(state.updated(sorted(sids.items()), retire, version))
    replay_ranker(fold_ranker({}, updates), ranker_updater, where, ids)
