"""Forward of a packed prefix + branches batch in bounded chunks.

The prefixes run first, once, into a KV cache; the branches then run in chunks of at most
``chunk_tokens`` tokens against the cached prefixes (positions continue from each prefix's end
exactly as in one forward). Small chunks keep activations in the CPU caches and bound memory
for any number of candidates; the prefix is still computed once per request.
"""

from __future__ import annotations

import torch

from genrec.engine.batch import PackedBatch
from genrec.model.decoder import DecoderLM
from genrec.model.layout import build_layout


def branch_chunks(lengths: list[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """Consecutive branch ranges [start, end) of at most ``chunk_tokens`` tokens (a longer
    branch gets a chunk of its own)."""
    chunks, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and used + n > chunk_tokens:
            chunks.append((start, i))
            start, used = i, 0
        used += n
    if lengths:
        chunks.append((start, len(lengths)))
    return chunks


def forward_chunked(
    model: DecoderLM, embeds: torch.Tensor, batch: PackedBatch, chunk_tokens: int
) -> torch.Tensor:
    """Final hidden states [T, hidden] of every packed token of ``batch``."""
    device = embeds.device
    full = batch.layout
    if full.num_tokens <= chunk_tokens or full.num_branches == 0:
        layout = full.to(device)
        return model(embeds, layout.positions, layout)

    hidden = embeds.new_empty(embeds.shape)
    prefix_layout = build_layout(batch.prefix_lens, [], []).to(device)
    cache = model.new_cache(prefix_layout)
    prefix_rows = full.prefix_tokens.to(device)
    hidden[prefix_rows] = model(embeds[prefix_rows], prefix_layout.positions, prefix_layout,
                                cache)

    lens = batch.branch_lens
    starts = batch.branch_starts
    for lo, hi in branch_chunks(lens, chunk_tokens):
        chunk_lens = torch.tensor(lens[lo:hi])
        layout = build_layout(
            [0] * full.num_requests, full.branch_request[lo:hi], chunk_lens,
            prefix_cached=batch.prefix_lens,
        ).to(device)
        # packed rows of the chunk's branch tokens, branch after branch
        first = torch.repeat_interleave(starts[lo:hi], chunk_lens)
        offset = torch.arange(int(chunk_lens.sum())) - torch.repeat_interleave(
            torch.cumsum(chunk_lens, 0) - chunk_lens, chunk_lens)
        rows = (first + offset).to(device)
        cache.reset_branches(hi - lo, int(chunk_lens.max()))
        hidden[rows] = model(embeds[rows], layout.positions, layout, cache)
    return hidden
