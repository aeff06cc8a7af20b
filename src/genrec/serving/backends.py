"""What the server serves besides the engine: an optional ranker and an optional catalog
updater, and their loaders (and the tokenizer's).

The ranker and the catalog updater are coded against the small protocols below, so that any
object with these methods can be served (the DuoLM ranker, or a test double); the batches
that use them run in :class:`genrec.serving.worker.Worker`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from genrec.duolm.requests import RowRankRequest
from genrec.live_catalog.host import CatalogUpdater

if TYPE_CHECKING:
    import torch

    from genrec.catalog.id_map import IdMap


@runtime_checkable
class Ranker(Protocol):
    """Scores candidates for users, items as the catalog's rows: ``rank_rows`` returns one
    1-D tensor of scores per request, in candidate order (higher is better), and raises
    ``ValueError`` naming the field for bad input (the DuoLM rankers' row-level path; the
    server translates ids once, at the edge)."""

    @property
    def catalog_version(self) -> int: ...

    def rank_rows(self, requests: Sequence[RowRankRequest]) -> list[torch.Tensor]: ...


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
        raise RuntimeError("--ranker needs --item-store STORE: the item store the ranker reads")
    return DuoRanker.from_pretrained(path, store, device=device, dtype=dtype)


class RankerCatalogUpdater:
    """A :class:`CatalogUpdater` over a DuoLM ranker's live item table.

    ``upsert`` items are ``{"item_id": i, "text": str}`` (encoded with the ranker's item
    encoder) or ``{"item_id": i, "vectors": [[...] * hidden] * k}``; ``retire`` takes ids.
    Each call is one all-or-nothing swap of the table (``DuoRanker.update``).
    """

    def __init__(self, ranker: Any) -> None:
        for name in ("update_rows", "encode_texts"):
            if not callable(getattr(ranker, name, None)):
                raise RuntimeError(f"--item-store: the ranker has no {name}() to update it with")
        self.ranker = ranker

    def upsert(self, items: list[dict[str, Any]], ids: IdMap | None = None) -> int:
        import torch

        bad = [k for k, it in enumerate(items) if ("text" in it) == ("vectors" in it)]
        if bad:
            raise ValueError(f"items[{bad[0]}]: give exactly one of 'text' or 'vectors'")
        texts = {it["item_id"]: it["text"] for it in items if "text" in it}
        vectors = {}
        for k, it in enumerate(items):
            if "vectors" not in it:
                continue
            try:
                vectors[it["item_id"]] = torch.as_tensor(it["vectors"], dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError):
                raise ValueError(f"items[{k}].vectors: expected a list of vectors of numbers "
                                 f"([k][hidden])") from None
        if any(not isinstance(t, str) for t in texts.values()):
            raise ValueError("items: 'text' must be a string")
        if texts and vectors:
            raise ValueError("items: give all items as 'text' or all as 'vectors' in one call")
        if texts:
            vectors = dict(zip(texts, self.ranker.encode_texts(list(texts.values())),
                               strict=True))
        return self.ranker.update_rows(vectors, ids=ids)

    def retire(self, item_ids: list[int], ids: IdMap | None = None) -> int:
        return self.ranker.update_rows(retire=item_ids, ids=ids)


def load_catalog_updater(store: str | Path, ranker: Ranker | None) -> CatalogUpdater:
    """The catalog updater of a served DuoLM ranker (the item store ``store`` is the one it
    was loaded from). Raises RuntimeError with a clear message when there is no ranker or
    ``genrec.duolm`` is not importable."""
    try:
        import genrec.duolm  # noqa: F401  # type: ignore[import-not-found]
    except ImportError as err:
        raise RuntimeError(f"--item-store needs genrec.duolm, which cannot be imported yet "
                           f"({err})") from err
    if ranker is None:
        raise RuntimeError(f"--item-store {store}: catalog updates need a --ranker to update")
    if isinstance(ranker, CatalogUpdater):
        return ranker
    return RankerCatalogUpdater(ranker)


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face tokenizer folder (for text in ``/v1/score``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
