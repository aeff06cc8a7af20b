"""Requests and results of the public Engine API, as dataclasses: scoring requests, and
recommendation requests and results in the catalog's ids or in its rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from genrec.engine.inputs import Part


@dataclass
class ScoreRequest:
    """One user: a shared prefix and the candidates to score after it."""

    prefix: Part
    candidates: Sequence[Part]
    user_vector: torch.Tensor | Sequence[float] | None = None


@dataclass
class RecommendRequest:
    """One user for generative retrieval (:meth:`genrec.engine.Engine.recommend`), items named
    by the catalog's own ids (strings; an integer names its decimal string, as over HTTP):
    ``history`` (oldest first), an optional user vector (soft token), and optional item
    filters (``exclude`` removes, ``allow`` restricts). ``text``: text token ids put before
    the history's Semantic IDs (a model whose vocabulary extends a pretrained LM's; ``None``:
    the vocabulary's default text)."""

    history: Sequence[str | int]
    user_vector: torch.Tensor | Sequence[float] | None = None
    exclude: Sequence[str | int] | None = None
    allow: Sequence[str | int] | None = None
    text: Sequence[int] | None = None


@dataclass
class Recommendation:
    """Top items of one request (the catalog's ids), best first, with summed
    log-probabilities of their Semantic IDs; ``ignored``: the request's ``history`` and
    ``exclude`` ids the catalog does not have (left out)."""

    items: list[str]
    scores: list[float]
    ignored: list[str] = field(default_factory=list)


@dataclass
class RowRequest:
    """:class:`RecommendRequest` with items as the catalog's rows ``0 .. N-1``: the engine's
    internal form (a server, the batch job and evaluation translate ids once, then use
    :meth:`genrec.engine.Engine.recommend_rows`)."""

    history: Sequence[int]
    user_vector: torch.Tensor | Sequence[float] | None = None
    exclude: Sequence[int] | None = None
    allow: Sequence[int] | None = None
    text: Sequence[int] | None = None


@dataclass
class RowRecommendation:
    """Top items of one :class:`RowRequest` (rows), best first, with summed log-probabilities
    of their Semantic IDs."""

    items: list[int]
    scores: list[float]
