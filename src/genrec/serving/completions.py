"""``/v1/completions`` prompts: Semantic-ID token ids or text like ``"<a_3> <b_1> <c_7>"``
to history item ids, and an item back to its Semantic-ID text.

With a vocabulary that extends a pretrained LM's (``SidVocab.text_vocab`` > 0) a prompt may
start with text: ``"Customer searched for a microscope. <a_3><b_1><c_7> ..."`` (the text is
encoded by the server's tokenizer, without its special tokens) or, as token ids,
``[bos, (soft,) text ids..., sid ids...]``. Text comes before the Semantic-ID tokens, as in
training (``bos [soft] text sid...``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from genrec.live_catalog.state import CatalogState

_SID_TOKEN = re.compile(r"<([a-z])_(\d+)>")


def parse_prompt(
    catalog: CatalogState, prompt: list[int] | str, user_vector: list[float] | None,
    tokenize: Callable[[str], list[int]] | None = None,
) -> tuple[list[int], list[int] | None]:
    """History item ids and text token ids (None: the prompt has no text) of a completion
    prompt, looked up in the current catalog; ``tokenize`` encodes the text of a string
    prompt (needed only when it has text)."""
    levels = catalog.num_levels
    vocab = catalog.base_vocab
    text: list[int] | None = None
    if isinstance(prompt, str):
        found = _SID_TOKEN.findall(prompt)
        first = _SID_TOKEN.search(prompt)
        lead = prompt[: first.start()] if first else prompt
        if not vocab.text_vocab and _SID_TOKEN.sub("", prompt).strip():
            raise ValueError("prompt: text prompts must be Semantic-ID tokens like "
                             "'<a_3> <b_1> <c_7>'")
        if _SID_TOKEN.sub("", prompt[len(lead):]).strip():
            raise ValueError("prompt: text must come before the Semantic-ID tokens "
                             "('some text <a_3> <b_1> <c_7> ...')")
        if lead.strip():
            if tokenize is None:
                raise ValueError("prompt: its text needs a tokenizer")
            text = tokenize(lead.strip())
            vocab.check_text(text, "prompt")
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
        bos, soft_id = vocab.bos_id, vocab.soft_id
        if not prompt or prompt[0] != bos:
            raise ValueError(f"prompt: must start with the BOS token id {bos}")
        soft = len(prompt) > 1 and prompt[1] == soft_id
        if soft != (user_vector is not None):
            raise ValueError(f"prompt: the soft token (id {soft_id}) and user_vector go together"
                             if soft else f"user_vector: the prompt has no soft token (id "
                             f"{soft_id})")
        body = prompt[2 if soft else 1:]
        n_text = 0  # leading text tokens (a vocabulary with text only)
        while n_text < len(body) and 0 <= body[n_text] < vocab.text_vocab:
            n_text += 1
        text, body = (body[:n_text] or None), body[n_text:]
        limit = catalog.level_offsets[-1] + catalog.codebook_sizes[-1]
        low = catalog.level_offsets[0] if vocab.text_vocab else 0
        wild = [t for t in body if not low <= t < limit]
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
    return [int(i) for i in items.tolist()], text


def item_text(catalog: CatalogState, item: int) -> str:
    """An item's Semantic-ID tokens as text: ``"<a_3> <b_1> <c_7>"``."""
    codes = catalog.codes_of([item])[0].tolist()
    return " ".join(f"<{chr(ord('a') + level)}_{c}>" for level, c in enumerate(codes))
