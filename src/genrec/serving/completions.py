"""``/v1/completions`` prompts: Semantic-ID token ids or text like ``"<a_3> <b_1> <c_7>"``
to history item ids, and an item back to its Semantic-ID text."""

from __future__ import annotations

import re

import torch

from genrec.engine.catalog_state import CatalogState
from genrec.generative.vocab import BOS_ID, SOFT_ID

_SID_TOKEN = re.compile(r"<([a-z])_(\d+)>")


def parse_prompt(catalog: CatalogState, prompt: list[int] | str,
                 user_vector: list[float] | None) -> list[int]:
    """History item ids of a completion prompt (token ids ``bos [soft] sid...`` or text of
    Semantic-ID tokens), looked up in the current catalog."""
    levels = catalog.num_levels
    if isinstance(prompt, str):
        found = _SID_TOKEN.findall(prompt)
        if _SID_TOKEN.sub("", prompt).strip():
            raise ValueError("prompt: text prompts must be Semantic-ID tokens like "
                             "'<a_3> <b_1> <c_7>'")
        codes, sizes = [], catalog.codebook_sizes
        for k, (letter, code) in enumerate(found):
            if ord(letter) - ord("a") != k % levels:
                raise ValueError(f"prompt: token {k} <{letter}_{code}> is out of order "
                                 f"(expected level {chr(ord('a') + k % levels)})")
            codes.append(min(int(code), sizes[k % levels]))  # beyond the codebook: no item
        if len(codes) % levels:
            raise ValueError(f"prompt: {len(codes)} tokens is not a whole number of "
                             f"{levels}-token Semantic IDs")
        grid = torch.tensor(codes, dtype=torch.int64).reshape(-1, levels)
        items = catalog.lookup(grid) if codes else torch.zeros(0)
    else:
        if not prompt or prompt[0] != BOS_ID:
            raise ValueError(f"prompt: must start with the BOS token id {BOS_ID}")
        soft = len(prompt) > 1 and prompt[1] == SOFT_ID
        if soft != (user_vector is not None):
            raise ValueError("prompt: the soft token (id 1) and user_vector go together"
                             if soft else "user_vector: the prompt has no soft token (id 1)")
        body = prompt[2 if soft else 1:]
        limit = catalog.level_offsets[-1] + catalog.codebook_sizes[-1]
        wild = [t for t in body if not 0 <= t < limit]
        if wild:
            raise ValueError(f"prompt: token id {wild[0]} is not a Semantic-ID token "
                             f"({catalog.level_offsets[0]}..{limit - 1})")
        if len(body) % levels:
            raise ValueError(f"prompt: {len(body)} tokens after the header is not a whole "
                             f"number of {levels}-token Semantic IDs")
        grid = torch.tensor(body, dtype=torch.int64).reshape(-1, levels)
        codes = grid - torch.tensor(catalog.level_offsets)
        inside = ((codes >= 0) & (codes < torch.tensor(catalog.codebook_sizes))).all(dim=1)
        items = torch.where(inside, catalog.lookup(codes.clamp(min=0)), -1) if body else (
            torch.zeros(0))
    missing = (items < 0).nonzero().flatten().tolist()
    if missing:
        raise ValueError(f"prompt: Semantic ID {missing[0]} is not a catalog item")
    return [int(i) for i in items.tolist()]


def item_text(catalog: CatalogState, item: int) -> str:
    """An item's Semantic-ID tokens as text: ``"<a_3> <b_1> <c_7>"``."""
    codes = catalog.codes_of([item])[0].tolist()
    return " ".join(f"<{chr(ord('a') + level)}_{c}>" for level, c in enumerate(codes))
