"""Codebooks of a residual k-means index: their sizes, picked from the catalog size
(``genrec index`` without ``--codebook-size``), and the codebooks themselves as saved with the
index (:class:`IdCodebooks`), what gives a new item the code a built index would.

A residual k-means index of ``L`` levels with ``K`` codes per level has ``K^L`` IDs. Too few
and many items share an ID (the dedup level then separates them by an arbitrary counter, which
the model must memorise); too many and most codes hold one or two items, so a code's embedding
is learned from almost no data and the upper levels stop grouping similar items (256 codes per
level for a catalog of 2,000 items leaves about 8 items per first-level code and a singleton
below it). The default takes the smallest power of two ``K >= MIN_CODES`` with
``K^L >= IDS_PER_ITEM * items``: about ``IDS_PER_ITEM`` IDs per item, so collisions are rare
while every level still splits its parent's items. A catalog smaller than ``MIN_CODES``
gets one code per item.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from genrec.catalog.kmeans import nearest_centroids, squared_distances

IDS_PER_ITEM = 16
MIN_CODES = 16
MAX_CODES = 1024


def default_codebook_size(num_items: int, levels: int) -> int:
    """Codes per level for ``num_items`` items and ``levels`` k-means levels: the smallest
    power of two in ``[MIN_CODES, MAX_CODES]`` whose ``levels``-th power is at least
    ``IDS_PER_ITEM * num_items`` (``MAX_CODES`` when none is), and never more codes than
    items (k-means cannot fill them)."""
    if num_items < 1:
        raise ValueError(f"num_items: must be >= 1, got {num_items}")
    if levels < 1:
        raise ValueError(f"levels: must be >= 1, got {levels}")
    k = MIN_CODES
    while k < MAX_CODES and k**levels < IDS_PER_ITEM * num_items:
        k *= 2
    return max(2, min(k, num_items))


#: The key of an index's ``meta`` that holds its :class:`IdCodebooks`.
CODEBOOKS_KEY = "id_assignment"
CODEBOOKS_FORMAT = 2
#: The collision rule of an index whose last level counts the items sharing the k-means codes.
COUNTER = "counter"
_KEYS = {"format", "codebooks", "normalize", "encoder", "collision", "collaborative"}
_KEYS_V1 = _KEYS - {"collaborative"}  # format 1: no collaborative part


def _packed(t: torch.Tensor) -> dict[str, Any]:
    # float32 little-endian bytes in base64: exact, and 4x smaller than JSON numbers
    array = t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4")
    return {"shape": list(array.shape), "float32": base64.b64encode(array.tobytes()).decode()}


def _unpacked(raw: Any, where: str) -> torch.Tensor:
    if not isinstance(raw, Mapping) or set(raw) != {"shape", "float32"}:
        raise ValueError(f"{where}: expected {{'shape', 'float32'}}")
    shape = raw["shape"]
    if (not isinstance(shape, list) or len(shape) != 2
            or not all(isinstance(v, int) and v > 0 for v in shape)):
        raise ValueError(f"{where}.shape: expected [codes, dim], got {shape!r}")
    try:
        data = base64.b64decode(str(raw["float32"]), validate=True)
    except ValueError:
        raise ValueError(f"{where}.float32: not base64") from None
    if len(data) != 4 * shape[0] * shape[1]:
        raise ValueError(f"{where}.float32: {len(data)} bytes for shape {shape}")
    t = torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32).reshape(shape))
    if not torch.isfinite(t).all():
        raise ValueError(f"{where}: NaN or infinite values")
    return t


@dataclass(frozen=True)
class IdCodebooks:
    """What assigns a new item the Semantic ID ``genrec index`` would have given it: the
    residual k-means ``centroids`` (level ``l``: float32 [K_l, dim]); ``normalize`` (``"l2"``:
    embeddings are L2-normalised first, as the sentence encoder does; ``None``: used as given);
    ``encoder`` (the sentence encoder that embedded the item text: ``model`` (the bundled
    package's name or a folder), ``dim``, ``max_length``; ``None``: the index was built from
    given embeddings); ``collision`` (:data:`COUNTER`: the index's last level counts the items
    that share the k-means codes, a new item takes the smallest free counter; ``None``: no
    such level); ``collaborative`` (the centroids' last dimensions that hold interaction
    factors, :mod:`genrec.catalog.collaborative`: a new item, which has no interactions, gets
    zeros there; 0: none).

    A new item is given by an embedding of :attr:`dim` values (its text's, or a given one);
    :meth:`prepared` turns it into what the centroids take."""

    centroids: tuple[torch.Tensor, ...]
    normalize: str | None = None
    encoder: Mapping[str, Any] | None = None
    collision: str | None = COUNTER
    collaborative: int = 0

    @property
    def dim(self) -> int:
        """Size of a new item's embedding (the centroids' less the collaborative part)."""
        return int(self.centroids[0].shape[1]) - self.collaborative

    @property
    def sizes(self) -> list[int]:
        """Codes per k-means level."""
        return [int(c.shape[0]) for c in self.centroids]

    def to_meta(self) -> dict[str, Any]:
        """The JSON-ready form kept in the index's ``meta`` under :data:`CODEBOOKS_KEY`."""
        return {"format": CODEBOOKS_FORMAT, "codebooks": [_packed(c) for c in self.centroids],
                "normalize": self.normalize,
                "encoder": dict(self.encoder) if self.encoder is not None else None,
                "collision": self.collision, "collaborative": self.collaborative}

    @classmethod
    def from_meta(cls, raw: Any, codebook_sizes: Sequence[int], where: str) -> IdCodebooks:
        """Read :meth:`to_meta`'s form, strictly: every key, shape and value checked against
        the index's ``codebook_sizes``; raises ``ValueError`` naming ``where`` and the key."""
        where = f"{where}: meta.{CODEBOOKS_KEY}"
        version = raw.get("format") if isinstance(raw, Mapping) else None
        if version not in (1, CODEBOOKS_FORMAT):
            raise ValueError(f"{where}.format: unsupported {version!r}")
        expected = _KEYS if version == CODEBOOKS_FORMAT else _KEYS_V1
        if set(raw) != expected:
            raise ValueError(f"{where}: expected the keys {sorted(expected)}, got {sorted(raw)}")
        if raw["normalize"] not in (None, "l2"):
            raise ValueError(f"{where}.normalize: expected 'l2' or null, got {raw['normalize']!r}")
        if raw["collision"] not in (None, COUNTER):
            raise ValueError(f"{where}.collision: expected {COUNTER!r} or null, got "
                             f"{raw['collision']!r}")
        books = raw["codebooks"]
        if not isinstance(books, list) or not books:
            raise ValueError(f"{where}.codebooks: expected a non-empty list")
        centroids = tuple(_unpacked(b, f"{where}.codebooks[{k}]") for k, b in enumerate(books))
        levels = len(centroids) + (raw["collision"] == COUNTER)
        sizes = [int(c.shape[0]) for c in centroids]
        if levels != len(codebook_sizes) or sizes != list(codebook_sizes[: len(sizes)]):
            raise ValueError(f"{where}.codebooks: sizes {sizes} (collision {raw['collision']!r})"
                             f" do not fit the index's codebook sizes {list(codebook_sizes)}")
        if len({int(c.shape[1]) for c in centroids}) != 1:
            raise ValueError(f"{where}.codebooks: levels of different dimensions")
        collaborative = raw.get("collaborative", 0)
        if (not isinstance(collaborative, int) or isinstance(collaborative, bool)
                or not 0 <= collaborative < centroids[0].shape[1]):
            raise ValueError(f"{where}.collaborative: expected 0 to "
                             f"{centroids[0].shape[1] - 1} dimensions, got {collaborative!r}")
        encoder = raw["encoder"]
        if encoder is not None:
            if (not isinstance(encoder, Mapping) or set(encoder) != {"model", "dim", "max_length"}
                    or not isinstance(encoder["model"], str)):
                raise ValueError(f"{where}.encoder: expected {{'model', 'dim', 'max_length'}}, "
                                 f"got {encoder!r}")
            if encoder["dim"] != centroids[0].shape[1] - collaborative:
                raise ValueError(f"{where}.encoder.dim: {encoder['dim']!r}, the codebooks' "
                                 f"{centroids[0].shape[1] - collaborative}")
        return cls(centroids, raw["normalize"], encoder, raw["collision"], collaborative)

    def prepared(self, embeddings: torch.Tensor) -> torch.Tensor:
        """New items' embeddings [n, dim] as the centroids take them: float32, normalised if
        recorded, zeros appended for the collaborative part."""
        x = embeddings.detach().to("cpu", torch.float32)
        if self.normalize == "l2":
            x = torch.nn.functional.normalize(x, dim=-1)
        if self.collaborative:
            x = torch.cat([x, x.new_zeros(*x.shape[:-1], self.collaborative)], dim=-1)
        return x

    def codes(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Nearest code per level on the residuals of ``embeddings`` [n, dim] (already
        :meth:`prepared`): codes int64 [n, levels], and every code of the last level, nearest
        first, int64 [n, K_last] (the alternatives when an ID under the nearest is not free)."""
        residual = embeddings.to(torch.float32).clone()
        codes = []
        for centroids in self.centroids:
            assign, _ = nearest_centroids(residual, centroids)
            codes.append(assign)
            last = residual
            residual = residual - centroids[assign]
        d2 = squared_distances(last, self.centroids[-1])
        order = d2.argsort(dim=1, stable=True)
        n, k = order.shape
        rest = order[order != codes[-1][:, None]].reshape(n, k - 1)
        return torch.stack(codes, dim=1), torch.cat([codes[-1][:, None], rest], dim=1)
