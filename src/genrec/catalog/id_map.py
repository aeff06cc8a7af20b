"""The catalog's own item ids (strings, as written in the user's table) <-> genrec's row
numbers ``0 .. N-1``: the one front door through which every public id enters and leaves.

An id is a string; a JSON integer names the same id as its decimal string (``1`` and ``"1"``
are movie 1: :func:`item_key`). At catalog scale no Python object is kept per item: the ids
are one UTF-8 buffer (NUL-separated) with their start offsets, and a lookup hashes the
requested ids (64-bit FNV-1a over the bytes, vectorised with numpy), finds them in the sorted
array of every id's hash (``searchsorted``) and checks the bytes (so a hash collision can
never name the wrong item). About 30 bytes per item of ten characters; see
``bench/id_map.py``.

Ids added after the map was built (a served catalog's upserts) sit in a small dict beside the
arrays and are folded into them once there are many (O(N), rarely). A map is immutable:
:meth:`IdMap.extended` returns a new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
_SHIFT = np.uint64(33)
_MAX_LISTED = 10  # unknown ids named in one error message
MAX_ID_BYTES = 1024


def check_key(value: object) -> str:
    """The id ``value`` names: a string as it is, an integer as its decimal string. Raises
    ``ValueError`` for anything else (``true``, ``1.5``, ``""``, a NUL, over
    :data:`MAX_ID_BYTES` bytes)."""
    if isinstance(value, str):
        key = value
    elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        key = str(int(value))
    else:
        raise ValueError(f"an item id is a string or an integer, got {value!r}")
    if not key or "\x00" in key or len(key.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(f"{key[:40]!r} is not an item id (1..{MAX_ID_BYTES} UTF-8 bytes, "
                         f"no NUL)")
    return key


def item_key(value: object, field: str = "item_id") -> str:
    """:func:`check_key`, its error naming ``field``."""
    try:
        return check_key(value)
    except ValueError as err:
        raise ValueError(f"{field}: {err}") from None


def item_keys(values: Iterable[object], field: str) -> list[str]:
    """:func:`item_key` of each value, errors naming ``field[k]``."""
    return [item_key(v, f"{field}[{k}]") for k, v in enumerate(values)]


def _pack(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    # the keys as one NUL-terminated UTF-8 buffer (uint8) and their starts [N + 1] (int64)
    if not keys:
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    buf = np.frombuffer(("\x00".join(keys) + "\x00").encode("utf-8"), dtype=np.uint8)
    ends = np.flatnonzero(buf == 0)
    if ends.size != len(keys):
        raise ValueError("item ids may not contain NUL characters")
    starts = np.empty(len(keys) + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends + 1
    return buf, starts


def _hash(buf: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """64-bit hash of each NUL-terminated string of ``buf`` (FNV-1a over its bytes, then a
    final mix): one vectorised pass per byte position over the strings that long (total work
    the buffer's size, however the lengths vary)."""
    lengths = np.diff(starts) - 1
    n = lengths.size
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return h
    order = np.argsort(-lengths, kind="stable")  # longest first
    # ``longer[p]``: how many strings have more than p bytes (the first ones of ``order``)
    longer = n - np.searchsorted(np.sort(lengths), np.arange(int(lengths.max())), side="right")
    first = starts[:-1][order]
    with np.errstate(over="ignore"):
        for p, count in enumerate(longer.tolist()):
            rows = order[:count]
            h[rows] = (h[rows] ^ buf[first[:count] + p].astype(np.uint64)) * _FNV_PRIME
        h ^= lengths.astype(np.uint64)
        h ^= h >> _SHIFT
        h *= _MIX[0]
        h ^= h >> _SHIFT
        h *= _MIX[1]
        h ^= h >> _SHIFT
    return h


class IdMap:
    """The table's item ids (strings) of rows ``0 .. len-1``, and back.

    Build it with :meth:`build` (ids in row order; duplicates refused) or :meth:`rows_named`
    (ids ``"0" .. "N-1"``: a catalog whose table named no ids). Public ids enter through
    :meth:`rows` (unknown ids refused, naming the field) or :meth:`known` (unknown ids left
    out and returned), and leave through :meth:`ids_of`."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, hashes: np.ndarray,
                 order: np.ndarray, added: dict[str, int] | None = None,
                 added_ids: tuple[str, ...] = ()) -> None:
        # the first ``n_base`` rows: ``buf`` / ``starts`` in row order, ``hashes`` sorted and
        # ``order[k]`` the row of ``hashes[k]``; later rows: ``added`` (id -> row)
        self._buf, self._starts, self._hashes, self._order = buf, starts, hashes, order
        self._added = added or {}
        self._added_ids = added_ids

    @classmethod
    def build(cls, ids: Sequence[object], field: str = "item_ids") -> IdMap:
        """The map of ``ids`` (row ``i`` is ``ids[i]``; integers name their decimal strings).
        Raises ``ValueError`` naming ``field`` for a bad or repeated id."""
        keys = [v if type(v) is str and v else item_key(v, f"{field}[{k}]")
                for k, v in enumerate(ids)]
        buf, starts = _pack(keys)
        lengths = np.diff(starts) - 1
        if lengths.size and int(lengths.max()) > MAX_ID_BYTES:
            k = int(np.argmax(lengths))
            item_key(keys[k], f"{field}[{k}]")  # raises, naming it
        hashes = _hash(buf, starts)
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        order = order.astype(np.int32 if len(keys) < 2**31 else np.int64)
        # runs of equal hashes: equal ids, or (rarely) a collision; the bytes decide
        same = np.flatnonzero(hashes[1:] == hashes[:-1])
        seen: dict[str, int] = {}
        for k in same.tolist():
            if k == 0 or hashes[k - 1] != hashes[k]:
                seen = {}  # a new run
            for row in sorted((int(order[k]), int(order[k + 1]))):
                first = seen.setdefault(keys[row], row)
                if first != row:
                    a, b = sorted((first, row))
                    raise ValueError(f"{field}[{b}]: item id {keys[b]!r} is given twice "
                                     f"(also {field}[{a}])")
        return cls(buf, starts, hashes, order)

    @classmethod
    def rows_named(cls, n: int) -> IdMap:
        """The ids ``"0" .. str(n-1)``: rows named by their own numbers."""
        return cls.build([str(i) for i in range(n)])

    def __len__(self) -> int:
        return self._starts.size - 1 + len(self._added)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (the added ids' dict not counted)."""
        return sum(a.nbytes for a in (self._buf, self._starts, self._hashes, self._order))

    def _key(self, row: int) -> str:
        return bytes(self._buf[self._starts[row]:self._starts[row + 1] - 1]).decode("utf-8")

    def ids_of(self, rows: Iterable[int]) -> list[str]:
        """The table ids of ``rows`` (valid rows: results of the engine)."""
        n_base = self._starts.size - 1
        out = []
        for r in rows:
            r = int(r)
            out.append(self._key(r) if r < n_base else self._added_ids[r - n_base])
        return out

    def find(self, keys: Sequence[str]) -> np.ndarray:
        """Row of each id (``-1``: unknown) -> int64 [len(keys)]; ``keys`` as
        :func:`item_key` gives them."""
        out = np.full(len(keys), -1, dtype=np.int64)
        if not keys:
            return out
        if self._added:
            for k, key in enumerate(keys):
                row = self._added.get(key)
                if row is not None:
                    out[k] = row
        if self._hashes.size == 0:
            return out
        qbuf, qstarts = _pack(keys)
        qh = _hash(qbuf, qstarts)
        pos = np.searchsorted(self._hashes, qh).clip(max=self._hashes.size - 1)
        hit = self._hashes[pos] == qh
        rows = self._order[pos].astype(np.int64)
        hit &= self._equal(rows, qbuf, qstarts)
        out[hit] = rows[hit]
        missed = np.flatnonzero(~hit & (self._hashes[pos] == qh)).tolist()
        for k in missed:  # a hash shared by several ids: the others of its run
            p = int(pos[k]) + 1
            while p < self._hashes.size and self._hashes[p] == qh[k]:
                if self._key(int(self._order[p])) == keys[k]:
                    out[k] = int(self._order[p])
                    break
                p += 1
        return out

    def _equal(self, rows: np.ndarray, qbuf: np.ndarray, qstarts: np.ndarray) -> np.ndarray:
        # whether the id of ``rows[k]`` is the k-th string of ``qbuf`` (compared byte by byte,
        # all at once; a byte of the NUL included, so lengths must agree too)
        qlen = np.diff(qstarts)
        rlen = self._starts[rows + 1] - self._starts[rows]
        same = qlen == rlen
        idx = np.flatnonzero(same)
        if idx.size == 0:
            return same
        lens = qlen[idx]
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        mine = self._buf[np.repeat(self._starts[rows[idx]], lens) + within]
        theirs = qbuf[np.repeat(qstarts[idx], lens) + within]
        differ = np.add.reduceat((mine != theirs).astype(np.int64), np.cumsum(lens) - lens)
        same[idx] = differ == 0
        return same

    def rows(self, values: Sequence[object], field: str) -> list[int]:
        """The rows of ``values`` (ids, or integers naming them). Raises ``ValueError`` naming
        ``field`` and the unknown ids."""
        keys = item_keys(values, field)
        found = self.find(keys)
        unknown = np.flatnonzero(found < 0)
        if unknown.size:
            raise ValueError(f"{field}: unknown item ids {unknown_list(keys, unknown)}")
        return found.tolist()

    def known(self, values: Sequence[object], field: str) -> tuple[list[int], list[str]]:
        """The rows of the known ids of ``values``, in order, and the unknown ids (as
        :func:`item_key` writes them), in order."""
        keys = item_keys(values, field)
        found = self.find(keys)
        ignored = [keys[k] for k in np.flatnonzero(found < 0).tolist()]
        return found[found >= 0].tolist(), ignored

    def extended(self, keys: Sequence[str]) -> IdMap:
        """A map with ``keys`` (ids none of which it has) as rows ``len(self)``, ... in order;
        folded into the arrays once the added ids are many (O(N), rarely)."""
        if not keys:
            return self
        n = len(self)
        added = dict(self._added)
        added.update((key, n + k) for k, key in enumerate(keys))
        out = IdMap(self._buf, self._starts, self._hashes, self._order, added,
                    (*self._added_ids, *keys))
        return out._folded() if len(added) >= max(4096, (self._starts.size - 1) // 16) else out

    def _folded(self) -> IdMap:
        # the added ids moved into the arrays (O(N))
        keys = list(self._added_ids)
        abuf, astarts = _pack(keys)
        ah = _hash(abuf, astarts)
        n_base = self._starts.size - 1
        buf = np.concatenate([self._buf, abuf])
        starts = np.concatenate([self._starts, astarts[1:] + self._buf.size])
        at = np.searchsorted(self._hashes, ah)
        sort = np.argsort(ah, kind="stable")
        hashes = np.insert(self._hashes, at[sort], ah[sort])
        rows = np.arange(n_base, n_base + len(keys))[sort]
        dtype = np.int32 if len(self) < 2**31 else np.int64
        order = np.insert(self._order.astype(dtype), at[sort], rows.astype(dtype))
        return IdMap(buf, starts, hashes, order)


def check_rows(rows: Iterable[object], n: int, field: str,
               error: type[Exception] = ValueError) -> None:
    """The check of rows given to genrec's own row-numbered APIs (the engine, the ranker, a
    catalog state): raises ``error`` naming ``field`` unless each is an integer in
    ``0 .. n-1``. Public ids are checked by :meth:`IdMap.rows` / :meth:`IdMap.known`."""
    for i in rows:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise error(f"{field}: item ids must be integers, got {i!r}")
        if not 0 <= i < n:
            raise error(f"{field}: unknown item id {i!r} (catalog has 0..{n - 1})")


def unknown_list(keys: Sequence[str], unknown: np.ndarray) -> str:
    """The unknown ids (of ``keys`` at positions ``unknown``) as an error message lists them."""
    listed = [keys[k] for k in unknown[:_MAX_LISTED].tolist()]
    more = unknown.size - len(listed)
    return f"{listed}" + (f" (and {more} more)" if more > 0 else "")
