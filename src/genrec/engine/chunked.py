"""Forward of a packed prefix + branches batch in bounded chunks.

The branches run in chunks of at most ``chunk_tokens`` branch tokens. The first chunk runs in
one forward with every request's prefix, which fills the KV cache; later chunks attend to the
cached prefixes (positions continue from each prefix's end exactly as in one forward). Small
chunks keep activations in the CPU caches and bound memory for any number of candidates; the
prefix is still computed once per request.

Index planning (layouts, packed rows) works on host tensors, marked ``host_side`` for the
no-host-sync test mode (:mod:`genrec.utils.sync_trap`); the rest runs on the model's device
and reads none of its data.
"""

from __future__ import annotations

import torch

from genrec.engine.batch import PackedBatch
from genrec.model.decoder import DecoderLM
from genrec.model.layout import AttentionLayout, Readout, branch_last_readout, build_layout
from genrec.utils.device import to_device
from genrec.utils.sync_trap import host_side


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


def _last_readout(
    batch: PackedBatch, lo: int, hi: int, local_rows: torch.Tensor, device: torch.device,
    first_request: int = 0, end_request: int | None = None, prefix_cap: int | None = None,
) -> Readout:
    # branches lo..hi-1 over requests first_request..end_request-1 (request ids made relative)
    end = len(batch.prefix_lens) if end_request is None else end_request
    return branch_last_readout(
        batch.prefix_lens[first_request:end],
        batch.layout.branch_request[lo:hi] - first_request, batch.branch_lens[lo:hi],
        local_rows, branch_cap=max(batch.branch_lens[lo:hi]), prefix_cap=prefix_cap,
    ).to(device)


def _branch_rows(batch: PackedBatch, lo: int, hi: int) -> torch.Tensor:
    # packed rows of branches lo..hi-1, branch after branch
    lens = torch.tensor(batch.branch_lens[lo:hi])
    first = torch.repeat_interleave(batch.branch_starts[lo:hi], lens)
    offset = torch.arange(int(lens.sum())) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens,
                                                                     lens)
    return first + offset


def _chunk_plan(
    batch: PackedBatch, lo: int, hi: int, first: bool, last_only: bool, device: torch.device,
) -> tuple[AttentionLayout, torch.Tensor, Readout | None, int, int]:
    # built on the host, moved to ``device``: the layout, packed rows and read-out (last_only)
    # of branches lo..hi-1, and the requests r0..r1-1 their layout and cache cover
    full = batch.layout
    chunk_lens = torch.tensor(batch.branch_lens[lo:hi])
    branch_rows = _branch_rows(batch, lo, hi)
    if first:
        # First chunk (its branches are those of the first requests): with every prefix.
        r0, r1 = 0, len(batch.prefix_lens)
        layout = build_layout(batch.prefix_lens, full.branch_request[lo:hi], chunk_lens)
        rows = torch.empty(layout.num_tokens, dtype=torch.long)
        rows[layout.prefix_tokens] = full.prefix_tokens
        rows[layout.branch_tokens] = branch_rows
        local = layout.branch_tokens
    else:
        # A chunk's branches belong to a contiguous range of requests: its layout and
        # cache cover those requests only, so no attention runs for the others' rows.
        r0, r1 = int(full.branch_request[lo]), int(full.branch_request[hi - 1]) + 1
        layout = build_layout(
            [0] * (r1 - r0), full.branch_request[lo:hi] - r0, chunk_lens,
            prefix_cached=batch.prefix_lens[r0:r1], prefix_cap=full.prefix_cap,
        )
        rows, local = branch_rows, torch.arange(len(branch_rows))
    readout = None
    if last_only:
        readout = _last_readout(batch, lo, hi, local[torch.cumsum(chunk_lens, 0) - 1],
                                device, r0, r1, full.prefix_cap)
    return layout.to(device), to_device(rows, device), readout, r0, r1


def forward_chunked(
    model: DecoderLM, embeds: torch.Tensor, batch: PackedBatch, chunk_tokens: int,
    last_only: bool = False,
) -> torch.Tensor:
    """Final hidden states [T, hidden] of the packed tokens of ``batch``.

    ``last_only``: only each branch's last row is defined on return (label and head scores
    read nothing else), and the last layer skips the other rows' work.
    """
    device = embeds.device
    full = batch.layout
    n_br = full.num_branches
    hidden = embeds.new_empty(embeds.shape)
    if full.num_tokens <= chunk_tokens or n_br == 0:
        with host_side():
            layout = full.to(device)
            if last_only and n_br:
                last = batch.branch_starts + torch.tensor(batch.branch_lens) - 1
                readout = _last_readout(batch, 0, n_br, last, device)
        if not last_only or n_br == 0:
            return model(embeds, layout.positions, layout)
        hidden[readout.rows] = model(embeds, layout.positions, layout, readout=readout)
        return hidden

    cache = None
    for lo, hi in branch_chunks(batch.branch_lens, chunk_tokens):
        with host_side():
            layout, rows, readout, r0, r1 = _chunk_plan(batch, lo, hi, cache is None,
                                                        last_only, device)
        if cache is None:
            cache = chunk_cache = model.new_cache(layout, transient=True)
        else:
            chunk_cache = cache.requests(r0, r1)
            chunk_cache.reset_branches(hi - lo, max(batch.branch_lens[lo:hi]))
        if readout is not None:
            hidden[rows[readout.rows]] = model(embeds[rows], layout.positions, layout,
                                               chunk_cache, readout=readout)
        else:
            hidden[rows] = model(embeds[rows], layout.positions, layout, chunk_cache)
    return hidden
