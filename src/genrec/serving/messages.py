"""The typed boundary between the HTTP side and the engine: one frozen dataclass per kind of
work, and the envelope of a batch sent to an engine process.

Each message is both the batch scheduler's grouping key (hashable: requests with equal
messages share one engine call) and what crosses the engine process's pipe with its payloads
(picklable). Payloads and results per message:

- :class:`RecommendBatch`: ``RowRequest`` -> ``Versioned[RowRecommendation]``;
- :class:`ScoreBatch`: ``list[ScoreRequest]`` (one HTTP request each) ->
  ``Versioned[list[Tensor]]`` (one ``[N, K]`` tensor per ``ScoreRequest``);
- :class:`RankBatch`: ``RowRankRequest`` -> ``Versioned[Tensor]`` (1-D scores);
- :class:`CatalogUpdate`: :class:`CatalogOp` (or a
  :class:`~genrec.live_catalog.update_plan.PreparedUpdate`, which stays in its process) ->
  :class:`~genrec.live_catalog.update_plan.CatalogChange`. Its ``seq`` makes every update a group of
  its own: updates never batch together.

Adding a kind of work is one message class here and one method of
:class:`~genrec.serving.worker.Worker`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from genrec.live_catalog.compaction import CatalogStats

T = TypeVar("T")


@dataclass(frozen=True)
class RecommendBatch:
    """Constrained beam search with ``beam_width`` beams, keeping the ``n`` best items."""

    kind: ClassVar[str] = "recommend"
    beam_width: int
    n: int


@dataclass(frozen=True)
class ScoreBatch:
    """Label scores (log-probabilities, or log-softmax over the labels) of scoring requests."""

    kind: ClassVar[str] = "score"
    label_token_ids: tuple[int, ...]
    apply_softmax: bool


@dataclass(frozen=True)
class RankBatch:
    """Candidate scores by the ranker (all rank requests batch together)."""

    kind: ClassVar[str] = "rank"


@dataclass(frozen=True)
class CatalogUpdate:
    """One catalog update; ``seq`` numbers the updates so that each is its own group."""

    kind: ClassVar[str] = "catalog"
    seq: int


Message = RecommendBatch | ScoreBatch | RankBatch | CatalogUpdate


@dataclass(frozen=True)
class CatalogOp:
    """A catalog update as plain data: ``op`` ``"upsert"`` (item dicts) or ``"retire"``
    (item ids), and its ``data``."""

    op: str
    data: list


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A result and the catalog version it was computed against."""

    value: T
    catalog_version: int


@dataclass(frozen=True)
class Batch:
    """A batch for an engine process: the message and one payload per request."""

    message: Message
    payloads: list[Any]


@dataclass(frozen=True)
class Reply:
    """An engine process's answer: ``ok`` and the results (or the error), and where its
    generative catalog stands (``None``: it has none)."""

    ok: bool
    value: Any
    catalog: CatalogStats | None = None
