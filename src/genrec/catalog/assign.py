"""Semantic IDs for new items, as ``genrec index`` would have given them: item text -> the
index's sentence encoder -> embedding (or an embedding given as is) -> the nearest code per
level on the residuals (the saved codebooks, :class:`~genrec.catalog.codebooks.IdCodebooks`)
-> the smallest collision counter no item of the catalog holds under those codes.

What holds exactly: with plain (not balanced) k-means, an item's codes in a built index are
its nearest codes, so an item assigned from its own embedding gets its own k-means codes, and
an item held out of the catalog gets back the full ID it had (its counter being the one free
under its codes), up to floating-point ties. Balanced k-means (the default of ``genrec
index``) moves an item to a farther code when the nearest is full; a new item always takes the
nearest. When every counter under the nearest codes is taken, the next-nearest code of the
last k-means level is tried, and so on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from genrec.catalog.codebooks import CODEBOOKS_KEY, COUNTER, IdCodebooks
from genrec.catalog.embeddings import BUNDLED_MODEL_PACKAGE, SentenceEncoder, format_item_text
from genrec.catalog.semantic_ids import SemanticIndex

#: The item holding each of candidate IDs [m, levels] now: int64 [m] (-1: none).
Lookup = Callable[[torch.Tensor], torch.Tensor]


def encoder_spec(encoder: SentenceEncoder, model: Path | None) -> dict[str, Any]:
    """What :class:`IdCodebooks` records of the sentence encoder that embedded an index's
    text (``model`` as given to it: ``None`` for the bundled one)."""
    name = BUNDLED_MODEL_PACKAGE if model is None else str(Path(model).absolute())
    return {"model": name, "dim": encoder.dim, "max_length": encoder.max_length}


def item_text(value: object, field: str) -> str:
    """An item's text for the encoder: a string as is, or ``{field: text}`` formatted as
    ``genrec index --from-text`` formats item text (:func:`format_item_text`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values()):
        return format_item_text({str(k): v for k, v in value.items()})
    raise ValueError(f"{field}: expected a string or an object of text fields")


class IdAssigner:
    """Assigns Semantic IDs to new items from an index's saved codebooks (see the module
    docstring); ``codebook_sizes``: the index's, collision level included. The sentence
    encoder is loaded on the first text."""

    def __init__(self, codebooks: IdCodebooks, codebook_sizes: Sequence[int],
                 device: torch.device | str | None = None) -> None:
        self.codebooks, self.codebook_sizes = codebooks, [int(k) for k in codebook_sizes]
        self.device = device
        self._encoder: SentenceEncoder | None = None

    @classmethod
    def of(cls, index: SemanticIndex, device: torch.device | str | None = None
           ) -> IdAssigner | None:
        """The assigner of an index built from text or embeddings (``None``: the index has no
        codebooks, e.g. one read from a ready-made Semantic-ID file)."""
        raw = index.meta.get(CODEBOOKS_KEY)
        if raw is None:
            return None
        return cls(IdCodebooks.from_meta(raw, index.codebook_sizes, "index"),
                   index.codebook_sizes, device)

    @property
    def dim(self) -> int:
        """Embedding size the codebooks take."""
        return self.codebooks.dim

    @property
    def takes_text(self) -> bool:
        """Whether the index was built from text (its encoder is known)."""
        return self.codebooks.encoder is not None

    def embed(self, texts: Sequence[str], field: str = "text") -> torch.Tensor:
        """Texts -> their embeddings with the index's sentence encoder, as the codebooks take
        them (``codebooks.prepared``)."""
        spec = self.codebooks.encoder
        if spec is None:
            raise ValueError(f"{field}: this index was built from embeddings, not text: send "
                             f"'embedding' ({self.dim} values) or 'semantic_id'")
        if self._encoder is None:
            model = None if spec["model"] == BUNDLED_MODEL_PACKAGE else spec["model"]
            encoder = SentenceEncoder(model, self.device, spec["max_length"])
            if encoder.dim != self.dim:
                raise ValueError(f"encoder {spec['model']}: {encoder.dim} dimensions, the "
                                 f"codebooks take {self.dim}")
            self._encoder = encoder
        return self.codebooks.prepared(self._encoder.encode(list(texts), progress=False))

    def embedding(self, values: object, field: str) -> torch.Tensor:
        """One given embedding as the codebooks take it (float32 [dim], normalised as the
        index's were); raises ``ValueError`` naming ``field``."""
        if (not isinstance(values, Sequence) or isinstance(values, str)
                or not all(isinstance(v, int | float) and not isinstance(v, bool)
                           for v in values)):
            raise ValueError(f"{field}: expected a list of {self.dim} numbers")
        if len(values) != self.dim:
            raise ValueError(f"{field}: expected {self.dim} values, got {len(values)}")
        t = torch.tensor(values, dtype=torch.float32)
        if not torch.isfinite(t).all():
            raise ValueError(f"{field}: NaN or infinite values")
        return self.codebooks.prepared(t[None])[0]

    def assign(self, embeddings: torch.Tensor, lookup: Lookup,
               owners: Sequence[int] | None = None,
               fields: Sequence[str] | None = None) -> list[list[int]]:
        """Semantic IDs of items from their embeddings (as :meth:`embed`, :meth:`embedding`
        or ``codebooks.prepared`` give them): none held by an item of the
        catalog (``lookup``) but the item itself (``owners[k]``: its row, -1 or ``None``: a
        new item), nor given to another of this call; raises ``ValueError`` (naming
        ``fields[k]``) when an item finds no free ID."""
        codes, ranked = self.codebooks.codes(embeddings)
        counter = self.codebooks.collision == COUNTER
        counters = self.codebook_sizes[-1] if counter else 1
        mine: set[tuple[int, ...]] = set()
        out = []
        for k in range(codes.shape[0]):
            found = None
            for last in ranked[k].tolist():
                prefix = [*codes[k, :-1].tolist(), last]
                candidates = torch.tensor([prefix + ([c] if counter else [])
                                           for c in range(counters)], dtype=torch.int64)
                holder = lookup(candidates)
                owner = owners[k] if owners is not None else -1
                free = ((holder < 0) | (holder == owner)).tolist()
                found = next((row for row, ok in zip(candidates.tolist(), free, strict=True)
                              if ok and tuple(row) not in mine), None)
                if found is not None:
                    break
            if found is None:
                field = fields[k] if fields is not None else f"items[{k}]"
                raise ValueError(f"{field}: no free Semantic ID near this item (every ID of "
                                 f"its nearest codes is taken); send 'semantic_id'")
            mine.add(tuple(found))
            out.append(found)
        return out




def with_items(index: SemanticIndex, ids: Sequence[str], codes: Sequence[Sequence[int]]
               ) -> SemanticIndex:
    """``index`` with new items (table ``ids``, Semantic IDs ``codes``) appended as its last
    rows, its codebooks and ``meta`` kept. Raises ``ValueError`` for an id it has."""
    names = list(index.item_ids) if index.item_ids is not None else [
        str(i) for i in range(index.num_items)]
    seen = set(names)
    for i in ids:
        if i in seen:
            raise ValueError(f"item {i!r}: already in the index (or given twice)")
        seen.add(i)
    rows = torch.tensor(list(codes), dtype=torch.int64).reshape(-1, index.num_levels)
    out = SemanticIndex(torch.cat([index.codes.cpu(), rows]), index.codebook_sizes,
                        [*names, *ids], dict(index.meta))
    out.validate()
    return out


def assign_upserts(items: list[dict[str, Any]], assigner: IdAssigner | None, lookup: Lookup,
                   owners: Sequence[int], ranker: bool
                   ) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The items of a catalog upsert with a Semantic ID assigned to each that has none and
    gives ``embedding``, or ``text`` that nothing else takes (no ``ranker``) or that the
    index's encoder embeds; ``embedding`` is consumed, ``text`` kept for the ``ranker`` (else
    consumed). ``owners``: each item's row (-1: new). Returns the items and the assigned IDs
    by item id. Raises ``ValueError`` naming the field: no codebooks (send ``semantic_id``),
    an embedding of the wrong size or beside a ``semantic_id``, a text the index cannot
    embed."""
    out = [dict(item) for item in items]
    wanted: list[tuple[int, torch.Tensor | str]] = []
    for k, item in enumerate(out):
        emb, text = item.pop("embedding", None), item.get("text")
        if item.get("semantic_id") is not None and emb is not None:
            raise ValueError(f"items[{k}].embedding: give 'embedding' (to be assigned a "
                             f"Semantic ID) or 'semantic_id', not both")
        if item.get("semantic_id") is not None or (emb is None and text is None):
            continue
        if emb is None and ranker and (assigner is None or not assigner.takes_text):
            continue  # the ranker's item alone, as without codebooks
        if assigner is None:
            source = "embedding" if emb is not None else "text"
            raise ValueError(f"items[{k}].semantic_id: required: this index has no codebooks "
                             f"to assign one from '{source}' (built from a ready-made "
                             f"Semantic-ID file)")
        if not ranker:
            item.pop("text", None)
        wanted.append((k, assigner.embedding(emb, f"items[{k}].embedding") if emb is not None
                       else item_text(text, f"items[{k}].text")))
    if not wanted:
        return out, {}
    texts = [(k, v) for k, v in wanted if isinstance(v, str)]
    vectors = dict((k, v) for k, v in wanted if not isinstance(v, str))
    if texts:
        embedded = assigner.embed([t for _, t in texts], f"items[{texts[0][0]}].text")
        vectors.update((k, embedded[j]) for j, (k, _) in enumerate(texts))
    order = [k for k, _ in wanted]
    sids = assigner.assign(torch.stack([vectors[k] for k in order]), lookup,
                           [owners[k] for k in order], [f"items[{k}]" for k in order])
    for k, sid in zip(order, sids, strict=True):
        out[k]["semantic_id"] = sid
    return out, {str(out[k]["item_id"]): sid for k, sid in zip(order, sids, strict=True)}
