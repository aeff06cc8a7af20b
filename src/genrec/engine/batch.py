"""Turning requests (prefix + branches) into one packed forward: inputs, layout, read-out rows."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from genrec.catalog.item_table import ItemTable
from genrec.engine.inputs import InputError, InputPacker, PackedInputs, Part
from genrec.engine.requests import ScoreRequest
from genrec.model.layout import AttentionLayout, shared_layout


@dataclass
class RequestLimits:
    """What every request is checked against before anything runs."""

    vocab_size: int
    max_positions: int
    item_rows: int  # rows of the item table (items * k); virtual ids must stay below
    user_dim: int  # 0: the model has no soft-token projector
    soft_token_id: int | None
    item_active: torch.Tensor | None = None  # [num_items] bool: False = retired item
    tokens_per_item: int = 1


@dataclass
class PackedBatch:
    """A packed forward: inputs, layout, and where each branch sits in the packed tokens."""

    inputs: PackedInputs
    layout: AttentionLayout
    prefix_lens: list[int]
    branch_lens: list[int]
    branch_starts: torch.Tensor  # [NB] packed index of each branch's first token
    prefix_last: torch.Tensor  # [R] packed index of each prefix's last token (-1 if empty)
    branch_counts: list[int]  # branches per request


def _as_user_vector(vector: object, limits: RequestLimits, field: str) -> torch.Tensor:
    if limits.user_dim == 0:
        raise InputError(f"{field}: this model has no soft-token projector (user_dim = 0)")
    v = torch.as_tensor(vector, dtype=torch.float32).reshape(-1)
    if v.numel() != limits.user_dim:
        raise InputError(f"{field}: expected dimension {limits.user_dim}, got {v.numel()}")
    if not torch.isfinite(v).all():
        raise InputError(f"{field}: contains NaN or infinite values")
    return v


def _locate(
    row: int, part_starts: list[int], part_names: list[str | tuple[str, int]]
) -> str:
    i = max(0, bisect.bisect_right(part_starts, row) - 1)
    name = part_names[i]
    return name if isinstance(name, str) else f"{name[0]}.candidates[{name[1]}]"


def _add_candidate(
    packer: InputPacker, cand: Part, where: str, c: int, p_len: int, max_positions: int
) -> int:
    n = packer.add(cand, lambda: f"{where}.candidates[{c}]")
    if n == 0:
        raise InputError(f"{where}.candidates[{c}]: empty candidate")
    if p_len + n > max_positions:
        raise InputError(
            f"{where}.candidates[{c}]: prefix ({p_len}) + candidate ({n}) tokens "
            f"exceed the model's maximum of {max_positions} positions"
        )
    return n


def pack_requests(
    prefixes: Sequence[Part],
    branches: Sequence[Sequence[Part]],
    user_vectors: Sequence[object | None],
    limits: RequestLimits,
    field: str = "requests",
    require_branches: bool = True,
) -> PackedBatch:
    """Validate and pack requests (prefix then its branches, request after request).

    Token checks run once, vectorised, over the whole packed batch; errors name the part.
    """
    packer = InputPacker()
    prefix_lens, branch_lens, branch_req, starts, prefix_last, counts = [], [], [], [], [], []
    part_starts: list[int] = []
    part_names: list[str | tuple[str, int]] = []
    req_starts: list[int] = []
    for r, (prefix, cands) in enumerate(zip(prefixes, branches, strict=True)):
        where = f"{field}[{r}]"
        if isinstance(cands, (str, bytes)) or (require_branches and not cands):
            raise InputError(f"{where}.candidates: empty candidate list")
        base = len(packer)
        req_starts.append(base)
        part_starts.append(base)
        part_names.append(f"{where}.prefix")
        p_len = packer.add(prefix, f"{where}.prefix")
        prefix_lens.append(p_len)
        prefix_last.append(base + p_len - 1 if p_len else -1)
        first = len(packer)
        # plain token lists go in one bulk step; otherwise part by part, errors named
        lens = packer.add_token_lists(cands, limits.max_positions - p_len)
        if lens is None:
            lens = [_add_candidate(packer, cand, where, c, p_len, limits.max_positions)
                    for c, cand in enumerate(cands)]
        if lens:
            cand_starts = list(accumulate(lens[:-1], initial=first))
            starts += cand_starts
            part_starts += cand_starts
            part_names += [(where, c) for c in range(len(lens))]  # named only on an error
        branch_lens += lens
        branch_req += [r] * len(lens)
        counts.append(len(lens))

    ids = packer.token_tensor()
    limit = limits.vocab_size + limits.item_rows
    beyond = torch.nonzero(ids >= limit)
    if beyond.numel():
        row = int(beyond[0])
        raise InputError(
            f"{_locate(row, part_starts, part_names)}: item token id {int(ids[row])} is beyond "
            f"the item table ({limits.item_rows} rows after vocabulary size {limits.vocab_size})"
        )
    if limits.item_active is not None:
        virtual = torch.nonzero(ids >= limits.vocab_size)[:, 0]
        items = (ids[virtual] - limits.vocab_size) // limits.tokens_per_item
        retired = torch.nonzero(~limits.item_active[items])
        if retired.numel():
            row = int(virtual[retired[0, 0]])
            raise InputError(
                f"{_locate(row, part_starts, part_names)}: item {int(items[retired[0, 0]])} "
                "is retired from the catalog"
            )
    soft_rows: list[int] = []
    if limits.soft_token_id is not None:
        soft_rows = torch.nonzero(ids == limits.soft_token_id)[:, 0].tolist()
    soft_by_request: dict[int, list[int]] = {}
    for row in soft_rows:
        name = _locate(row, part_starts, part_names)
        if not name.endswith(".prefix"):
            raise InputError(f"{name}: the soft-token placeholder may only appear in the prefix")
        r = bisect.bisect_right(req_starts, row) - 1
        soft_by_request.setdefault(r, []).append(row)
    users: list[torch.Tensor] = []
    soft_used: list[int] = []
    for r, user in enumerate(user_vectors):
        where = f"{field}[{r}]"
        found = soft_by_request.get(r, [])
        if user is None:
            if found:
                raise InputError(
                    f"{where}.prefix: soft-token placeholder given without user_vector"
                )
            continue
        vector = _as_user_vector(user, limits, f"{where}.user_vector")
        if len(found) != 1:
            raise InputError(
                f"{where}.prefix: a user vector needs exactly one soft-token placeholder "
                f"(id {limits.soft_token_id}), found {len(found)}"
            )
        users.append(vector)
        soft_used.append(found[0])

    layout = shared_layout(prefix_lens, branch_req, branch_lens)
    return PackedBatch(
        inputs=packer.finish(soft_used, users, ids), layout=layout, prefix_lens=prefix_lens,
        branch_lens=branch_lens, branch_starts=torch.tensor(starts, dtype=torch.long),
        prefix_last=torch.tensor(prefix_last, dtype=torch.long), branch_counts=counts,
    )


def item_rows(table: ItemTable | None) -> int:
    return table.num_rows if table is not None else 0


def token_groups(requests: Sequence[ScoreRequest], max_tokens: int) -> list[list[ScoreRequest]]:
    """``requests`` in order, cut into groups of at most ``max_tokens`` tokens (prefix and
    candidates; a request is never split, so one may be alone over it)."""
    groups: list[list[ScoreRequest]] = [[]]
    used = 0
    for req in requests:
        size = len(req.prefix) + sum(len(c) for c in req.candidates)
        if groups[-1] and used + size > max_tokens:
            groups.append([])
            used = 0
        groups[-1].append(req)
        used += size
    return groups
