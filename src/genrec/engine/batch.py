"""Turning requests (prefix + branches) into one packed forward: inputs, layout, read-out rows."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
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


@dataclass
class _Placement:
    """Where each request's parts sit in the packed tokens, filled request by request."""

    prefix_lens: list[int] = field(default_factory=list)
    prefix_last: list[int] = field(default_factory=list)  # -1: empty prefix
    branch_lens: list[int] = field(default_factory=list)
    branch_req: list[int] = field(default_factory=list)  # request of each branch
    branch_starts: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # branches per request
    req_starts: list[int] = field(default_factory=list)
    # first token of each part (prefix or candidate) and its name, for errors
    part_starts: list[int] = field(default_factory=list)
    part_names: list[str | tuple[str, int]] = field(default_factory=list)

    def locate(self, row: int) -> str:
        """The name of the part holding packed token ``row``."""
        i = max(0, bisect.bisect_right(self.part_starts, row) - 1)
        name = self.part_names[i]
        return name if isinstance(name, str) else f"{name[0]}.candidates[{name[1]}]"

    def request_of(self, row: int) -> int:
        """The request holding packed token ``row``."""
        return bisect.bisect_right(self.req_starts, row) - 1


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


def _add_request(packer: InputPacker, at: _Placement, r: int, where: str, prefix: Part,
                 cands: Sequence[Part], limits: RequestLimits, require_branches: bool) -> None:
    """Pack request ``r``'s prefix, then its candidates, recording where they sit."""
    if isinstance(cands, (str, bytes)) or (require_branches and not cands):
        raise InputError(f"{where}.candidates: empty candidate list")
    base = len(packer)
    at.req_starts.append(base)
    at.part_starts.append(base)
    at.part_names.append(f"{where}.prefix")
    p_len = packer.add(prefix, f"{where}.prefix")
    at.prefix_lens.append(p_len)
    at.prefix_last.append(base + p_len - 1 if p_len else -1)
    first = len(packer)
    # plain token lists go in one bulk step; otherwise part by part, errors named
    lens = packer.add_token_lists(cands, limits.max_positions - p_len)
    if lens is None:
        lens = [_add_candidate(packer, cand, where, c, p_len, limits.max_positions)
                for c, cand in enumerate(cands)]
    if lens:
        cand_starts = list(accumulate(lens[:-1], initial=first))
        at.branch_starts += cand_starts
        at.part_starts += cand_starts
        at.part_names += [(where, c) for c in range(len(lens))]  # named only on an error
    at.branch_lens += lens
    at.branch_req += [r] * len(lens)
    at.counts.append(len(lens))


def _check_item_tokens(ids: torch.Tensor, limits: RequestLimits, at: _Placement) -> None:
    """Every item token within the item table, and none of a retired item."""
    beyond = torch.nonzero(ids >= limits.vocab_size + limits.item_rows)
    if beyond.numel():
        row = int(beyond[0])
        raise InputError(
            f"{at.locate(row)}: item token id {int(ids[row])} is beyond "
            f"the item table ({limits.item_rows} rows after vocabulary size {limits.vocab_size})"
        )
    if limits.item_active is not None:
        virtual = torch.nonzero(ids >= limits.vocab_size)[:, 0]
        items = (ids[virtual] - limits.vocab_size) // limits.tokens_per_item
        retired = torch.nonzero(~limits.item_active[items])
        if retired.numel():
            row = int(virtual[retired[0, 0]])
            raise InputError(
                f"{at.locate(row)}: item {int(items[retired[0, 0]])} is retired from the catalog"
            )


def _soft_rows(ids: torch.Tensor, limits: RequestLimits, at: _Placement) -> dict[int, list[int]]:
    """The packed rows of the soft-token placeholder, by request (prefixes only)."""
    if limits.soft_token_id is None:
        return {}
    by_request: dict[int, list[int]] = {}
    for row in torch.nonzero(ids == limits.soft_token_id)[:, 0].tolist():
        name = at.locate(row)
        if not name.endswith(".prefix"):
            raise InputError(f"{name}: the soft-token placeholder may only appear in the prefix")
        by_request.setdefault(at.request_of(row), []).append(row)
    return by_request


def _user_vectors(user_vectors: Sequence[object | None], soft: dict[int, list[int]],
                  limits: RequestLimits, field: str) -> tuple[list[torch.Tensor], list[int]]:
    """The requests' user vectors and the packed row of each one's placeholder (exactly one
    per vector, none without)."""
    users: list[torch.Tensor] = []
    soft_used: list[int] = []
    for r, user in enumerate(user_vectors):
        where = f"{field}[{r}]"
        found = soft.get(r, [])
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
    return users, soft_used


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
    packer, at = InputPacker(), _Placement()
    for r, (prefix, cands) in enumerate(zip(prefixes, branches, strict=True)):
        _add_request(packer, at, r, f"{field}[{r}]", prefix, cands, limits, require_branches)
    ids = packer.token_tensor()
    _check_item_tokens(ids, limits, at)
    users, soft_used = _user_vectors(user_vectors, _soft_rows(ids, limits, at), limits, field)
    layout = shared_layout(at.prefix_lens, at.branch_req, at.branch_lens)
    return PackedBatch(
        inputs=packer.finish(soft_used, users, ids), layout=layout, prefix_lens=at.prefix_lens,
        branch_lens=at.branch_lens, branch_starts=torch.tensor(at.branch_starts, dtype=torch.long),
        prefix_last=torch.tensor(at.prefix_last, dtype=torch.long), branch_counts=at.counts,
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
