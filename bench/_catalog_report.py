"""Tables and goal checks of ``bench/catalog.py`` from its workers' JSON records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common import format_table

Json = dict[str, Any]
Key = tuple[str, int, str, int]  # catalog, batch, filter, width


def _size(n: int) -> str:
    for div, unit in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n:,}"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _update(rec: Json, key: str) -> float | None:
    s = rec.get("updates_s", {}).get(key)
    return None if s is None else s * 1e3


def _delta_key(rec: Json) -> str | None:
    return next((k for k in rec.get("updates_s", {}) if "_on_delta_" in k), None)


# metric label, value of a record, digits
_ROWS: list[tuple[str, Callable[[Json], float | None], int]] = [
    ("build (s)", lambda r: r.get("build_s"), 2),
    ("trie (MB)", lambda r: r.get("trie_bytes", 0) / 1e6, 1),
    ("trie bytes / item", lambda r: r.get("trie_bytes", 0) / r["items"], 1),
    ("state tensors (MB)", lambda r: r.get("state_bytes", 0) / 1e6, 1),
    ("state bytes / item", lambda r: r.get("state_bytes", 0) / r["items"], 1),
    ("state with live delta (MB)", lambda r: r.get("delta_state_bytes", 0) / 1e6, 1),
    ("update: 1 retire (ms)", lambda r: _update(r, "retire_1"), 2),
    ("update: 1 + 1 (ms)", lambda r: _update(r, "changes_1"), 2),
    ("update: 1,000 + 1,000 (ms)", lambda r: _update(r, "changes_1000"), 1),
    ("update: 100,000 + 100,000 (ms)", lambda r: _update(r, "changes_100000"), 0),
    ("update: 1 + 1 on the largest delta (ms)",
     lambda r: _update(r, k) if (k := _delta_key(r)) else None, 2),
    ("compaction (s)", lambda r: r.get("compact_s"), 2),
    ("peak RSS (GB)", lambda r: r.get("peak_rss_bytes", 0) / 1e9, 2),
]


def _grid(rec: Json | None) -> dict[Key, Json]:
    if not rec:
        return {}
    return {(x["catalog"], x["batch"], x["filter"], x["width"]): x
            for x in rec.get("recommend", [])}


def size_tables(n: int, recs: dict[str, Json]) -> str:
    """The catalog table and the recommend table of one size."""
    sparse, dense = recs.get("sparse", {}), recs.get("dense")
    out = [f"\n-- {_size(n)} items (dedup level size {sparse.get('codebook_sizes', ['?'])[-1]};"
           f" load {sparse.get('load_before', 0):.2f} -> {sparse.get('load_after', 0):.2f})"]
    for rec in (sparse, dense):
        if rec and "error" in rec:
            out.append(f"{rec['impl']}: {rec['error']}")
    rows = []
    for label, fn, digits in _ROWS:
        a = fn(sparse) if "error" not in sparse else None
        b = fn(dense) if dense and "error" not in dense else None
        rows.append([label, _num(a, digits), _num(b, digits), _ratio(b, a)])
    out.append(format_table(["", "genrec", "dense trie", "dense / genrec"], rows))
    if "levels" in sparse:
        out.append("genrec trie levels: " + "; ".join(
            f"{lv['nodes']:,} nodes x {lv['K']} {'dense' if lv['dense'] else 'CSR'} "
            f"{lv['bytes'] / 1e6:.1f} MB" for lv in sparse["levels"]))
    out.append(f"1,000 + 1,000 update visible: {sparse.get('visible')}; answers on the live "
               f"delta equal its compaction's: {sparse.get('compacted_answers_equal')}")
    if sparse.get("paired"):
        small = _size(sparse["paired_items"])
        rows = [[x["catalog"], str(x["batch"]), x["filter"], str(x["width"]),
                 _num(x["small_ms"]), _num(x["large_ms"]), _ratio(x["large_ms"], x["small_ms"])]
                for x in sparse["paired"]]
        out.append(f"\n{small} and {_size(n)} items timed alternately in one process (median "
                   "ms; the same model, so the ratio is the catalog's)")
        out.append(format_table(["catalog", "batch", "filter", "width", small, _size(n),
                                 f"{_size(n)} / {small}"], rows))
    gs, gd = _grid(sparse), _grid(dense)
    for name, grid in (("genrec", gs), ("dense", gd)):
        if grid:
            loaded = sum(x.get("others_busy", 0) >= 0.5 for x in grid.values())
            out.append(f"{name}: {loaded} of {len(grid)} recommend settings started while "
                       "other processes kept >= 0.5 core busy (after --quiet-wait)")
    rows = []
    for key, x in gs.items():
        d = gd.get(key)
        rows.append([*map(str, key), _num(x["ms"]), _num(d and d["ms"]),
                     _ratio(d and d["ms"], x["ms"]), _num(x["filter_ms"], 2),
                     _num(d and d["filter_ms"], 2)])
    out.append("\nrecommend latency (median ms; filters: building the filters alone)")
    out.append(format_table(["catalog", "batch", "filter", "width", "genrec", "dense",
                             "dense / genrec", "filters genrec", "filters dense"], rows))
    return "\n".join(out)


def summary_tables(results: dict[int, dict[str, Json]], baseline_max: int) -> str:
    """genrec's figures across sizes, the baseline's where it ran, and recommend latency
    across sizes with the largest size's ratio to the smallest."""
    sizes = sorted(results)
    head = ["", *(_size(n) for n in sizes)]
    rows = []
    for impl in ("sparse", "dense"):
        for label, fn, digits in _ROWS:
            cells = []
            for n in sizes:
                rec = results[n].get(impl)
                cells.append(_num(fn(rec), digits) if rec and "error" not in rec else "-")
            if any(c != "-" for c in cells):
                rows.append([f"{'genrec' if impl == 'sparse' else 'dense'}: {label}", *cells])
    out = [f"\n== Across sizes (dense baseline up to {_size(baseline_max)} items)",
           format_table(head, rows)]
    grids = {n: _grid(results[n].get("sparse")) for n in sizes}
    keys = list(grids[sizes[0]])
    rows = []
    for key in keys:
        ms = [grids[n].get(key, {}).get("ms") for n in sizes]
        rows.append([*map(str, key), *(_num(m) for m in ms), _ratio(ms[-1], ms[0])])
    out.append("\ngenrec recommend latency across sizes (median ms)")
    out.append(format_table(["catalog", "batch", "filter", "width", *head[1:],
                             f"{head[-1]} / {head[1]}"], rows))
    return "\n".join(out)


def goal_checks(results: dict[int, dict[str, Json]]) -> list[Json]:
    """The issue's goals at the largest size (recommend latency against the smallest)."""
    sizes = sorted(results)
    small, large = results[sizes[0]]["sparse"], results[sizes[-1]]["sparse"]
    tag = _size(sizes[-1])
    if "error" in large or "error" in small:
        return [{"goal": "all", "measured": "a worker failed", "pass": False}]
    goals = []

    def add(goal: str, value: float, limit: float, text: str) -> None:
        goals.append({"goal": goal, "measured": text, "value": value, "limit": limit,
                      "pass": value <= limit})

    gs, gl = _grid(small), _grid(large)
    if len(sizes) > 1:
        for key in (("fresh", 1, "none", 32), ("fresh", 1, "exclude100", 32)):
            if key in gs and key in gl:
                a, b = gs[key]["ms"], gl[key]["ms"]
                add(f"recommend {tag} / {_size(sizes[0])} <= 1.2 ({', '.join(map(str, key))})",
                    b / a, 1.2, f"{b:.1f} ms / {a:.1f} ms = {b / a:.2f}")
        ratios = {k: gl[k]["ms"] / gs[k]["ms"] for k in gs if k in gl}
        if ratios:
            k = max(ratios, key=ratios.get)
            add(f"recommend {tag} / {_size(sizes[0])} <= 1.2, worst of {len(ratios)} settings",
                ratios[k], 1.2, f"{ratios[k]:.2f} at {', '.join(map(str, k))} "
                f"({gl[k]['ms']:.1f} ms / {gs[k]['ms']:.1f} ms)")
    paired = {(x["catalog"], x["batch"], x["filter"], x["width"]): x["large_ms"] / x["small_ms"]
              for x in large.get("paired", [])}
    for key in (("fresh", 1, "none", 32), ("fresh", 1, "exclude100", 32)):
        if key in paired:
            x = next(p for p in large["paired"] if (p["catalog"], p["batch"], p["filter"],
                                                    p["width"]) == key)
            add(f"recommend {tag} / {_size(sizes[0])} <= 1.2 ({', '.join(map(str, key))}; "
                "alternating in one process)", paired[key], 1.2,
                f"{x['large_ms']:.1f} ms / {x['small_ms']:.1f} ms = {paired[key]:.2f}")
    if paired:
        k = max(paired, key=paired.get)
        add(f"recommend {tag} / {_size(sizes[0])} <= 1.2, worst of {len(paired)} settings "
            "alternating in one process", paired[k], 1.2,
            f"{paired[k]:.2f} at {', '.join(map(str, k))}")
    rss = large["peak_rss_bytes"] / 1e9
    add(f"peak RSS at {tag} <= 4 GB", rss, 4.0, f"{rss:.2f} GB")
    add(f"build at {tag} <= 10 s", large["build_s"], 10.0, f"{large['build_s']:.2f} s")
    upd = _update(large, "changes_1000")
    if upd is not None:
        add(f"1,000 upserts + 1,000 retires applied and visible at {tag} <= 100 ms", upd,
            100.0, f"{upd:.1f} ms (visible: {large.get('visible')})")
        goals[-1]["pass"] = goals[-1]["pass"] and bool(large.get("visible"))
    per_item = large["trie_bytes"] / large["items"]
    add(f"trie bytes per item at {tag} <= 64", per_item, 64.0, f"{per_item:.1f} B")
    return goals
