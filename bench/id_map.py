"""The id map at catalog scale: memory per item, build time, and the lookups a request makes
(a width-32 request's history and a 1,000-id exclude list) against ids like ``sku-0000001``.

    python bench/id_map.py --items 10000000
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np

from genrec.catalog.id_map import IdMap


def _rss_mib() -> float:
    # peak resident memory of this process so far
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    n = args.items
    start = time.perf_counter()
    ids = [f"sku-{i:07d}" for i in range(n)]
    generated = time.perf_counter() - start
    start = time.perf_counter()
    m = IdMap.build(ids)
    built = time.perf_counter() - start
    rng = np.random.default_rng(0)
    history = [ids[i] for i in rng.integers(0, n, 32).tolist()]
    exclude = [ids[i] for i in rng.integers(0, n, 1000).tolist()]
    unknown = [f"new-{i}" for i in range(32)]
    assert m.rows(history, "history") == [int(i[4:]) for i in history]
    rows = {
        "history of 32 known ids": _median_ms(lambda: m.rows(history, "history"), args.repeats),
        "32 unknown ids (known())": _median_ms(lambda: m.known(unknown, "h"), args.repeats),
        "exclude list of 1,000 ids": _median_ms(lambda: m.rows(exclude, "exclude"),
                                                args.repeats),
        "32 rows back to ids": _median_ms(lambda: m.ids_of(range(32)), args.repeats),
    }
    print(f"items: {n:,}; ids generated in {generated:.1f} s, map built in {built:.1f} s")
    print(f"map arrays: {m.nbytes / 2**20:.0f} MiB = {m.nbytes / n:.1f} bytes per item; "
          f"peak RSS {_rss_mib():.0f} MiB (the Python list of ids included)")
    for name, ms in rows.items():
        print(f"{name:28s} {ms * 1000:8.0f} us (median of {args.repeats})")


if __name__ == "__main__":
    main()
