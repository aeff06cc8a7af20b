"""DuoLM rankers on the engine: the student (virtual item tokens) and the full-text teacher.

``rank`` speaks the catalog's own ids (:class:`~genrec.duolm.requests.RankRequest` in,
:class:`~genrec.duolm.requests.Ranking` out); ``rank_rows`` is the row-level path the server,
training, evaluation and the batch job use.

Both score a user's candidates in one multi-item scoring request per user (prefix once, each
candidate attending to the prefix and itself); a score is log p(yes) at the candidate's last
token. The student reads item representations from the engine's item table, which can be
updated live (:meth:`DuoRanker.update`): every call reads the table once, so a request sees the
old table or the new one, never a mix, and a retired item is rejected, never scored.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from genrec.catalog.id_map import IdMap, check_rows, item_keys
from genrec.catalog.item_table import ItemTable
from genrec.duolm.encoder import ItemEncoder, compute_features
from genrec.duolm.prompts import SOFT_ID, YES_ID, StudentPrompts, TeacherPrompts
from genrec.duolm.requests import Ranking, RankRequest, RowRankRequest, TableIds, rank_by_ids
from genrec.duolm.store import StoreVersion, load_store, write_store
from genrec.engine.engine import Engine
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import InputError
from genrec.engine.params import ScoreParams
from genrec.engine.requests import ScoreRequest
from genrec.model.checkpoint import load_model

META_FILE = "duolm.json"
ENCODER_DIR = "item_encoder"


class Prompts(Protocol):
    def prefix(self, history: Sequence[int], soft: bool = False) -> list[int]: ...

    def candidate(self, item: int) -> list[int]: ...


def _check_ids(ids: Sequence[int], num_items: int, active: torch.Tensor | None,
               field: str) -> None:
    check_rows(ids, num_items, field, InputError)  # in Python: past int64 is no tensor
    t = torch.tensor(list(ids), dtype=torch.long)
    if active is not None and t.numel() and not bool(active[t].all()):
        raise InputError(f"{field}: item {int(t[~active[t]][0])} is retired from the catalog")


def rank_requests(
    engine: Engine, prompts: Prompts, requests: Sequence[RowRankRequest], yes_id: int,
    num_items: int, table: ItemTable | None = None, feedback: bool = False,
) -> list[torch.Tensor]:
    """Scores [n_candidates] per request: one scoring request per user, all batched.

    Shared by the student and the teacher (and by their evaluation), so both are measured
    on exactly the engine path that serves them.
    """
    if not requests:
        raise InputError("requests: empty request list")
    active = table.active if table is not None else None
    score_reqs = []
    for r, req in enumerate(requests):
        where = f"requests[{r}]"
        if not len(req.candidates):
            raise InputError(f"{where}.candidates: empty candidate list")
        _check_ids(req.history, num_items, active, f"{where}.history")
        _check_ids(req.candidates, num_items, active, f"{where}.candidates")
        soft = req.user_vector is not None
        if feedback and req.feedback is not None:
            try:
                prefix = prompts.prefix(req.history, soft, req.feedback)  # type: ignore[call-arg]
            except ValueError as err:
                raise InputError(f"{where}.{err}") from None
        else:
            prefix = prompts.prefix(req.history, soft)
        score_reqs.append(ScoreRequest(prefix, [prompts.candidate(c) for c in req.candidates],
                                       req.user_vector))
    params = ScoreParams(mode="labels", label_token_ids=[yes_id])
    return [s[:, 0] for s in engine.score_requests(score_reqs, params, item_table=table)]


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ``duolm.json`` of a ranker checkpoint (raises when the folder is not one)."""
    file = Path(path) / META_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {META_FILE} (not a DuoLM student or teacher)")
    return json.loads(file.read_text())


class DuoRanker:
    """The DuoLM student: ranker engine + device-resident item table (+ encoder for updates)."""

    def __init__(
        self, engine: Engine, table: ItemTable, encoder: ItemEncoder | None = None,
        item_ids: list[str] | None = None, max_history: int = 20,
    ) -> None:
        self.engine = engine
        self.encoder = encoder
        self.prompts = StudentPrompts(k=table.tokens_per_item,
                                      vocab_size=engine.model.config.vocab_size,
                                      max_history=max_history)
        names = list(item_ids) if item_ids is not None else \
            [str(i) for i in range(table.num_items)]
        if len(names) != table.num_items:
            raise ValueError(f"item_ids: {len(names)} ids for a table of {table.num_items} items")
        self._catalog = TableIds(table, names)  # what the id path reads, in one access
        self._lock = threading.Lock()  # serialises updates; readers never wait
        engine.set_item_table(table)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, store: str | Path | StoreVersion, device: str = "cpu",
        dtype: str | torch.dtype | None = None,
    ) -> DuoRanker:
        """Load a student checkpoint and the current version of an item store (a store folder,
        or representations already in memory)."""
        meta = read_meta(path)
        if meta.get("kind") != "student":
            raise ValueError(f"{path}: a {meta.get('kind')} checkpoint, not a DuoLM student")
        model = load_model(path, dtype=dtype, device=device)
        snapshot = store if isinstance(store, StoreVersion) else load_store(store)
        encoder_dir = Path(path) / ENCODER_DIR
        encoder = ItemEncoder.load(encoder_dir, device) if encoder_dir.is_dir() else None
        engine = Engine(model, config=EngineConfig(soft_token_id=SOFT_ID))
        return cls(engine, snapshot.table(), encoder, snapshot.item_ids,
                   int(meta.get("max_history", 20)))

    @property
    def table(self) -> ItemTable:
        table = self.engine.item_table
        assert table is not None
        return table

    @property
    def catalog_version(self) -> int:
        return self.table.version

    @property
    def item_ids(self) -> list[str]:
        """The catalog's id of each row of the current table (do not modify)."""
        return self._catalog.item_ids

    def rank(self, requests: Sequence[RankRequest]) -> list[Ranking]:
        """Each request's candidates (the catalog's ids) ordered by score, best first, with
        the ``history`` ids the catalog lacks (``ignored``; left out). Raises ``InputError``
        naming ``requests[i].<field>`` for bad input: an unknown or retired candidate, an
        empty candidate list, feedback not matching the history."""
        catalog = self._catalog  # read once: the whole call uses this table and its ids
        return rank_by_ids(requests, catalog.ids,
                           lambda rows: self._rank_rows(rows, catalog.table))

    def rank_rows(self, requests: Sequence[RowRankRequest]) -> list[torch.Tensor]:
        """The internal row-level ``rank``: scores [n_candidates] per request, in candidate
        order (higher is better); items are the table's rows."""
        return self._rank_rows(requests, self.table)  # the table read once

    def _rank_rows(self, requests: Sequence[RowRankRequest], table: ItemTable | None
                   ) -> list[torch.Tensor]:
        assert table is not None
        return rank_requests(self.engine, self.prompts, requests, YES_ID, table.num_items,
                             table, feedback=True)

    def update(self, vectors: Mapping[str | int, torch.Tensor] | None = None,
               retire: Sequence[str | int] = ()) -> int:
        """Add or replace items' representations ([k, hidden] each) keyed by the catalog's
        ids (an unseen id adds an item; ``1`` and ``"1"`` are the same id) and retire items
        by id, all or nothing; returns the new table version. Raises ``InputError`` naming
        the field: a bad, repeated or (retired) unknown id, a bad shape, NaN."""
        vectors = dict(vectors or {})
        with self._lock:
            ids = self._catalog.ids
            try:
                keys = item_keys(list(vectors), "items")
                retired = ids.rows(list(retire), "retire")
            except ValueError as err:
                raise InputError(str(err)) from None
            if len(set(keys)) != len(keys):
                raise InputError("items: an item id is given twice (1 and \"1\" are one id)")
            rows = ids.find(keys)
            unseen = rows < 0  # added as rows len(ids), ... in the order given
            rows[unseen] = len(ids) + np.arange(int(unseen.sum()))
            grown = ids.extended([keys[j] for j in np.flatnonzero(unseen).tolist()])
            return self._swap(dict(zip(rows.tolist(), vectors.values(), strict=True)), retired,
                              grown)

    def update_rows(self, vectors: Mapping[int, torch.Tensor] | None = None,
                    retire: Sequence[int] = (), ids: IdMap | None = None) -> int:
        """The row-level :meth:`update` (a served catalog's updater): ``vectors`` by table
        row, ``retire`` rows. ``ids``: the served catalog's id map after the update; the
        table grows to its length, rows it names that the ranker has no vectors for are
        added retired (items of the generative catalog only). Without ``ids`` (the table's
        own), no row can be added."""
        with self._lock:
            return self._swap(dict(vectors or {}), list(retire), ids)

    def _swap(self, vectors: dict[int, torch.Tensor], retire: list[int],
              ids: IdMap | None) -> int:
        # one all-or-nothing swap of the table and its ids (under the lock)
        old = self.table
        n, k, h = old.num_items, old.tokens_per_item, old.hidden_size
        for i, v in vectors.items():
            if tuple(v.shape) != (k, h):
                raise InputError(f"items[{i}]: expected [{k}, {h}] vectors, "
                                 f"got {tuple(v.shape)}")
            if not bool(torch.isfinite(v).all()):
                raise InputError(f"items[{i}]: NaN or infinite values")
        ids = self._catalog.ids if ids is None else ids
        total = len(ids)  # the table's rows: those the id map names
        if total < n:
            raise InputError(f"items: an id map of {total} items for a table of {n}")
        _check_ids(list(vectors), total, None, "items")
        _check_ids(retire, total, None, "retire")
        table = torch.zeros(total, k, h, dtype=old.vectors.dtype, device=old.vectors.device)
        table[:n] = old.vectors
        active = torch.zeros(total, dtype=torch.bool)  # rows past n: retired until given
        active[:n] = True if old.active is None else old.active
        if vectors:
            rows = torch.tensor(list(vectors), dtype=torch.long)
            table[rows.to(table.device)] = torch.stack(list(vectors.values())).to(table)
            active[rows] = True
        if retire:
            active[torch.tensor(retire, dtype=torch.long)] = False
        new = ItemTable(table, version=old.version + 1, active=active)
        catalog = TableIds(new, ids)
        self.engine.set_item_table(new)  # the swap row-level readers see
        self._catalog = catalog  # the swap id-level readers see
        return new.version

    def upsert_texts(self, texts: Mapping[str | int, str]) -> int:
        """Encode item texts (keyed by the catalog's ids) with the item encoder, then swap
        them in (see :meth:`update`)."""
        return self.update(dict(zip(texts, self.encode_texts(list(texts.values())),
                                    strict=True)))

    def encode_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Item representations [len(texts), k, hidden] from the item encoder."""
        if self.encoder is None:
            raise ValueError("this ranker was loaded without its item encoder")
        if not texts:
            raise InputError("items: empty list")
        return self.encoder.encode_all(compute_features(self.encoder.config, list(texts),
                                                        progress=False))

    def save_store(self, path: str | Path) -> int:
        """Write the current table as a new store version; returns its number."""
        table = self.table
        return write_store(path, table.vectors.float().cpu(), self.item_ids, table.active,
                           {"source": "live update", "table_version": table.version})


class TeacherRanker:
    """The full-text teacher: the same scoring path over text-token prompts; ``item_ids``:
    the catalog's id of each row (``None``: ``"0" .. "N-1"``)."""

    def __init__(self, engine: Engine, prompts: TeacherPrompts,
                 item_ids: Sequence[str] | None = None) -> None:
        self.engine = engine
        self.prompts = prompts
        self._catalog = TableIds.of_catalog(item_ids, prompts.num_items)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, item_text: Mapping[int, Mapping[str, str]], num_items: int,
        device: str = "cpu", dtype: str | torch.dtype | None = None,
        item_ids: Sequence[str] | None = None,
    ) -> TeacherRanker:
        """Load a teacher checkpoint; ``item_text[row]``: the item's text fields, ``item_ids``:
        the catalog's id of each row (``None``: ``"0" .. "N-1"``)."""
        meta = read_meta(path)
        if meta.get("kind") != "teacher":
            raise ValueError(f"{path}: a {meta.get('kind')} checkpoint, not a DuoLM teacher")
        prompts = TeacherPrompts.from_items(
            item_text, num_items, max_title_tokens=int(meta["max_title_tokens"]),
            max_text_tokens=int(meta["max_text_tokens"]), max_history=int(meta["max_history"]))
        engine = Engine(load_model(path, dtype=dtype, device=device),
                        config=EngineConfig(soft_token_id=prompts.soft_id))
        return cls(engine, prompts, item_ids)

    def rank(self, requests: Sequence[RankRequest]) -> list[Ranking]:
        """As :meth:`DuoRanker.rank`: the candidates (ids) best first, with ``ignored``."""
        return rank_by_ids(requests, self._catalog.ids, self.rank_rows)

    def rank_rows(self, requests: Sequence[RowRankRequest]) -> list[torch.Tensor]:
        """The internal row-level ``rank``: scores [n_candidates] per request, in candidate
        order."""
        return rank_requests(self.engine, self.prompts, requests, self.prompts.yes_id,
                             self.prompts.num_items)
