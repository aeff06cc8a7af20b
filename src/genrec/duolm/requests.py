"""The DuoLM rankers' requests and results: in the catalog's own ids (the public ``rank``) and
in its rows ``0 .. N-1`` (the internal ``rank_rows``), and the translation between them.

:meth:`genrec.duolm.DuoRanker.rank` takes :class:`RankRequest` (items named by the catalog's
ids, as ``/v1/rank`` names them) and answers one :class:`Ranking` per request; it scores
:class:`RowRankRequest` through ``rank_rows``, which the server, training, evaluation and the
batch job call directly (they translate ids once, or never had any). Unknown ``history`` ids
are left out (with their feedback) and reported (``ignored``); an unknown candidate id is an
error naming ``requests[i].candidates`` and the id.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from genrec.catalog.id_map import IdMap, item_keys
from genrec.catalog.item_table import ItemTable
from genrec.engine.inputs import InputError


@dataclass
class RankRequest:
    """One user, items named by the catalog's own ids (strings; an integer names its decimal
    string, as over HTTP): ``history`` (oldest first), the ``candidates`` to score, an optional
    user vector (soft token) and optional per-history-item ``feedback`` (``rating_1`` ..
    ``rating_5``, ``like``, ``skip`` or ``None``)."""

    history: Sequence[str | int]
    candidates: Sequence[str | int]
    user_vector: Sequence[float] | torch.Tensor | None = None
    feedback: Sequence[str | None] | None = None


@dataclass
class Ranking:
    """One request's candidates (the catalog's ids), best first, with their scores (log p(yes)
    at the candidate's last token; higher is better; ties keep the request's order). A
    candidate given twice is listed twice. ``ignored``: the request's ``history`` ids the
    catalog does not have (left out)."""

    items: list[str]
    scores: list[float]
    ignored: list[str] = field(default_factory=list)


@dataclass
class RowRankRequest:
    """:class:`RankRequest` with items as the catalog's rows ``0 .. N-1``: the rankers' internal
    form (``rank_rows`` answers a 1-D tensor of scores per request, in candidate order)."""

    history: Sequence[int]
    candidates: Sequence[int]
    user_vector: Sequence[float] | torch.Tensor | None = None
    feedback: Sequence[str | None] | None = None


class TableIds:
    """An item table (``None``: a ranker without one, the teacher) and the ids of its rows,
    read together in one attribute access: given as a list (the :class:`IdMap` is built on
    first use, O(N) once per table) or as a map (the list is written on first use)."""

    def __init__(self, table: ItemTable | None, item_ids: Sequence[str] | IdMap) -> None:
        self.table = table
        if isinstance(item_ids, IdMap):
            self.__dict__["ids"] = item_ids
        else:
            self.__dict__["item_ids"] = list(item_ids)

    @classmethod
    def of_catalog(cls, item_ids: Sequence[str] | None, num_items: int) -> TableIds:
        """A table-less ranker's ids: ``item_ids`` (``None``: ``"0" .. "N-1"``), one per row."""
        names = list(item_ids) if item_ids is not None else [str(i) for i in range(num_items)]
        if len(names) != num_items:
            raise ValueError(f"item_ids: {len(names)} ids for a catalog of {num_items} items")
        return cls(None, names)

    @functools.cached_property
    def ids(self) -> IdMap:
        """The map of :attr:`item_ids` (a repeated id raises ``ValueError``)."""
        return IdMap.build(self.item_ids)

    @functools.cached_property
    def item_ids(self) -> list[str]:
        """The id of each row, in row order."""
        return self.ids.ids_of(range(len(self.ids)))


def to_row_requests(requests: Sequence[RankRequest], ids: IdMap
                    ) -> tuple[list[RowRankRequest], list[list[str]]]:
    """Each request in rows, and the ``history`` ids it names that ``ids`` lacks (left out,
    with their feedback). Raises ``InputError`` naming the field: a bad id, an unknown
    candidate, feedback not matching the history, or a history none of whose items is known
    and no user vector."""
    rows, ignored = [], []
    for r, req in enumerate(requests):
        where = f"requests[{r}]"
        for name in ("history", "candidates"):
            if isinstance(getattr(req, name), (str, bytes)):
                raise InputError(f"{where}.{name}: expected a list of item ids")
        if req.feedback is not None and len(req.feedback) != len(req.history):
            raise InputError(f"{where}.feedback: {len(req.feedback)} values for a history of "
                             f"{len(req.history)} items")
        try:
            keys = item_keys(req.history, f"{where}.history")
            candidates = ids.rows(list(req.candidates), f"{where}.candidates")
        except ValueError as err:
            raise InputError(str(err)) from None
        found = ids.find(keys)
        known = found >= 0
        unknown = [keys[k] for k in np.flatnonzero(~known).tolist()]
        if keys and not bool(known.any()) and req.user_vector is None:
            raise InputError(f"{where}.history: none of its {len(keys)} items is in the "
                             f"catalog ({unknown[:10]}), and there is no user_vector: "
                             f"nothing to rank for")
        feedback = None if req.feedback is None else \
            [fb for fb, keep in zip(req.feedback, known.tolist(), strict=True) if keep]
        rows.append(RowRankRequest(found[known].tolist(), candidates, req.user_vector,
                                   feedback))
        ignored.append(unknown)
    return rows, ignored


def to_rankings(requests: Sequence[RowRankRequest], scores: Sequence[torch.Tensor], ids: IdMap,
                ignored: Sequence[list[str]]) -> list[Ranking]:
    """Each request's candidates named by ``ids``, ordered by their ``scores`` (best first)."""
    out = []
    for req, values, skipped in zip(requests, scores, ignored, strict=True):
        values = values.detach().float().cpu().reshape(-1)
        order = torch.argsort(values, descending=True, stable=True).tolist()
        out.append(Ranking(ids.ids_of(req.candidates[i] for i in order),
                           [float(values[i]) for i in order], skipped))
    return out


def rank_by_ids(requests: Sequence[RankRequest], ids: IdMap,
                rank_rows: Callable[[list[RowRankRequest]], list[torch.Tensor]]
                ) -> list[Ranking]:
    """``rank_rows`` (a ranker's row-level scoring) over ``requests`` translated by ``ids``."""
    rows, ignored = to_row_requests(requests, ids)
    return to_rankings(rows, rank_rows(rows), ids, ignored)
