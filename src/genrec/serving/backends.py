"""What the server runs: the engine, an optional ranker and an optional catalog updater.

The ranker and the catalog updater are coded against the small protocols below, so that any
object with these methods can be served (the DuoLM ranker, or a test double).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from genrec.engine import Engine

try:  # the DuoLM ranker's request type, once that package exists
    from genrec.duolm.ranker import RankRequest  # type: ignore[import-not-found]
except ImportError:

    @dataclass
    class RankRequest:  # type: ignore[no-redef]
        """One user to rank for (same fields as ``genrec.duolm.ranker.RankRequest``)."""

        history: Sequence[int]
        candidates: Sequence[int]
        user_vector: Sequence[float] | None = None


@runtime_checkable
class Ranker(Protocol):
    """Scores candidates for users: ``rank`` returns one 1-D tensor of scores per request
    (higher is better) and raises ``ValueError`` naming the field for bad input."""

    @property
    def catalog_version(self) -> int: ...

    def rank(self, requests: Sequence[RankRequest]) -> list[torch.Tensor]: ...


@runtime_checkable
class CatalogUpdater(Protocol):
    """Changes the served catalog; both methods return the new catalog version and raise
    ``ValueError`` naming the field for bad input."""

    def upsert(self, items: list[dict[str, Any]]) -> int: ...

    def retire(self, item_ids: list[int]) -> int: ...


def make_runner(
    engine: Engine, ranker: Ranker | None, catalog_version: Callable[[], int],
    catalog: Callable[[], Any] | None = None,
) -> Callable[[Hashable, list[Any]], Sequence[Any]]:
    """The scheduler's batch runner. Groups (first element: the kind) and results:

    - ``("recommend", beam_width, n)``: payloads ``RecommendRequest``; results
      ``(Recommendation, catalog version)``;
    - ``("score", label_ids, apply_softmax)``: payloads lists of ``ScoreRequest`` (one HTTP
      request each); results ``(list of [N, K] tensors, catalog version)``;
    - ``("rank",)``: payloads ``RankRequest``; results ``(1-D tensor, catalog version)``;
    - ``("catalog", seq)``: one payload ``("upsert", items)`` or ``("retire", item_ids)``
      (or one already prepared, :meth:`~genrec.serving.catalog.ServiceCatalog.prepare`),
      applied to the :class:`genrec.serving.catalog.ServiceCatalog` that ``catalog()``
      returns; result its :class:`~genrec.serving.catalog.CatalogChange`. Running updates
      here serialises them with the engine batches.

    Payloads and results are plain picklable data (prepared updates aside: they stay in their
    process), so the same runner can run in another process
    (:mod:`genrec.serving.engine_process`).
    """
    from genrec.engine import BeamParams, ScoreParams

    def run(group: Hashable, payloads: list[Any]) -> Sequence[Any]:
        kind = group[0]
        version = catalog_version()  # read on the worker thread: no update runs concurrently
        if kind == "recommend":
            _, beam_width, n = group
            recs = engine.recommend(payloads, BeamParams(beam_width=beam_width, n=n))
            return [(rec, version) for rec in recs]
        if kind == "score":
            _, labels, softmax = group
            flat = [req for requests in payloads for req in requests]
            params = ScoreParams(mode="labels", label_token_ids=list(labels),
                                 apply_softmax=softmax)
            scores = engine.score_requests(flat, params)
            out, start = [], 0
            for requests in payloads:
                out.append((scores[start:start + len(requests)], version))
                start += len(requests)
            return out
        if kind == "rank":
            return [(scores, version) for scores in ranker.rank(payloads)]
        if kind == "catalog":
            target = catalog() if catalog is not None else None
            if target is None:
                raise RuntimeError("no service catalog to update")
            return [target.apply(update) for update in payloads]
        raise RuntimeError(f"unknown batch kind {kind!r}")

    return run


def load_ranker(path: str | Path, store: str | Path | None, device: str = "cpu",
                dtype: str | None = None) -> Ranker:
    """The DuoLM student ranker in ``path`` over the item store ``store``
    (``genrec.duolm.ranker.DuoRanker.from_pretrained``).

    Raises RuntimeError with a clear message while ``genrec.duolm`` is not importable.
    """
    try:
        from genrec.duolm.ranker import DuoRanker  # type: ignore[import-not-found]
    except ImportError as err:
        raise RuntimeError(f"--ranker needs genrec.duolm.ranker.DuoRanker, which cannot be "
                           f"imported yet ({err})") from err
    if store is None:
        raise RuntimeError("--ranker needs --catalog STORE: the item store the ranker reads")
    return DuoRanker.from_pretrained(path, store, device=device, dtype=dtype)


class RankerCatalogUpdater:
    """A :class:`CatalogUpdater` over a DuoLM ranker's live item table.

    ``upsert`` items are ``{"item_id": i, "text": str}`` (encoded with the ranker's item
    encoder) or ``{"item_id": i, "vectors": [[...] * hidden] * k}``; ``retire`` takes ids.
    Each call is one all-or-nothing swap of the table (``DuoRanker.update``).
    """

    def __init__(self, ranker: Any) -> None:
        for name in ("update", "upsert_texts"):
            if not callable(getattr(ranker, name, None)):
                raise RuntimeError(f"--catalog: the ranker has no {name}() to update it with")
        self.ranker = ranker

    def upsert(self, items: list[dict[str, Any]]) -> int:
        import torch

        texts = {it["item_id"]: it["text"] for it in items if "text" in it}
        vectors = {it["item_id"]: torch.as_tensor(it["vectors"], dtype=torch.float32)
                   for it in items if "vectors" in it}
        bad = [k for k, it in enumerate(items) if ("text" in it) == ("vectors" in it)]
        if bad:
            raise ValueError(f"items[{bad[0]}]: give exactly one of 'text' or 'vectors'")
        if any(not isinstance(t, str) for t in texts.values()):
            raise ValueError("items: 'text' must be a string")
        if texts and vectors:
            raise ValueError("items: give all items as 'text' or all as 'vectors' in one call")
        return self.ranker.upsert_texts(texts) if texts else self.ranker.update(vectors)

    def retire(self, item_ids: list[int]) -> int:
        return self.ranker.update(retire=item_ids)


def load_catalog_updater(store: str | Path, ranker: Ranker | None) -> CatalogUpdater:
    """The catalog updater of a served DuoLM ranker (the item store ``store`` is the one it
    was loaded from). Raises RuntimeError with a clear message when there is no ranker or
    ``genrec.duolm`` is not importable."""
    try:
        import genrec.duolm  # noqa: F401  # type: ignore[import-not-found]
    except ImportError as err:
        raise RuntimeError(f"--catalog needs genrec.duolm, which cannot be imported yet "
                           f"({err})") from err
    if ranker is None:
        raise RuntimeError(f"--catalog {store}: catalog updates need a --ranker to update")
    if isinstance(ranker, CatalogUpdater):
        return ranker
    return RankerCatalogUpdater(ranker)


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face tokenizer folder (for text in ``/v1/score``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
