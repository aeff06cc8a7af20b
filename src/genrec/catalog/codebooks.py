"""Codebook sizes picked from the catalog size (``genrec index`` without ``--codebook-size``).

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
