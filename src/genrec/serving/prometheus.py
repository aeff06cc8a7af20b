"""Prometheus metrics of the server, in a registry of its own (one per app).

- ``genrec_requests_total{endpoint, status}``: answered requests;
- ``genrec_request_seconds{endpoint}``: latency histogram (whole request, queue included);
- ``genrec_batch_size{kind}`` / ``genrec_batch_seconds{kind}``: engine batches;
- ``genrec_queue_depth``: requests waiting for the engine;
- ``genrec_catalog_version``: the catalog version being served;
- ``genrec_rejected_total{reason}``: requests refused for load (queue_full, draining, deadline,
  catalog_behind: a replica that has not reached the request's min_catalog_version; memory: a
  batch that did not fit in memory now or ran out of it; too_large: a request over the memory
  budget alone);
- ``genrec_batch_splits_total``: batches split into runs that fit the memory budget;
- ``genrec_catalog_delta_items``: items in the generative catalog's delta (changes since its
  last compaction), ``genrec_catalog_compacting``: 1 while a background compaction runs,
  ``genrec_catalog_compaction_seconds{outcome}``: finished compactions (installed, dropped,
  failed) and their wall time; of the engine that searches (the engine process's with
  ``--engine-process``), present when there is a generative catalog;
- ``genrec_memory_budget_bytes``: the engine's memory budget, taken at start (a fraction of the
  device's free memory, of the available RAM on the CPU; ``genrec.engine.memory``).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from genrec.live_catalog.compaction import CatalogStats

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COMPACTION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    """The server's metrics; ``render()`` gives the Prometheus text exposition."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queue_depth: Callable[[], int], catalog_version: Callable[[], int],
                 catalog_stats: Callable[[], CatalogStats | None] | None = None,
                 memory_budget: int | None = None) -> None:
        """``catalog_stats``: the generative catalog's stats, drained at each render;
        ``memory_budget``: the engine's budget in bytes (no gauge when ``None``)."""
        self.registry = CollectorRegistry()
        self.catalog_stats = catalog_stats
        self._catalog_metrics: tuple[Gauge, Gauge, Histogram] | None = None
        self.requests = Counter("genrec_requests", "Requests answered, by endpoint and status.",
                                ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("genrec_request_seconds", "Request latency in seconds.",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("genrec_batch_size", "Requests per engine batch.", ["kind"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram("genrec_batch_seconds", "Engine time per batch.",
                                       ["kind"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rejected = Counter("genrec_rejected", "Requests refused for load or deadline.",
                                ["reason"], registry=self.registry)
        self.splits = Counter("genrec_batch_splits", "Batches split to fit the memory budget.",
                              registry=self.registry)
        depth = Gauge("genrec_queue_depth", "Requests waiting for the engine.",
                      registry=self.registry)
        depth.set_function(lambda: float(queue_depth()))
        version = Gauge("genrec_catalog_version", "Catalog version being served.",
                        registry=self.registry)
        version.set_function(lambda: float(catalog_version()))
        if memory_budget is not None:
            Gauge("genrec_memory_budget_bytes", "The engine's memory budget in bytes, taken at "
                  "start.", registry=self.registry).set(memory_budget)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request and record its latency."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def observe_batch(self, kind: str, size: int, seconds: float) -> None:
        """Record one engine batch of ``kind`` (a message's kind: ``recommend``, ...)."""
        self.batch_size.labels(kind=kind).observe(size)
        self.batch_seconds.labels(kind=kind).observe(seconds)

    def observe_split(self) -> None:
        """Count one batch split into runs that fit the memory budget."""
        self.splits.inc()

    def reject(self, reason: str) -> None:
        """Count a request refused for ``reason``."""
        self.rejected.labels(reason=reason).inc()

    def _observe_catalog(self) -> None:
        stats = self.catalog_stats() if self.catalog_stats is not None else None
        if stats is None:
            return
        if self._catalog_metrics is None:  # created once there is a generative catalog
            self._catalog_metrics = (
                Gauge("genrec_catalog_delta_items", "Items in the generative catalog's delta "
                      "(changes since its last compaction).", registry=self.registry),
                Gauge("genrec_catalog_compacting", "1 while a background catalog compaction "
                      "runs.", registry=self.registry),
                Histogram("genrec_catalog_compaction_seconds", "Background catalog "
                          "compactions by outcome, wall time in seconds.", ["outcome"],
                          buckets=COMPACTION_BUCKETS, registry=self.registry))
        delta, compacting, seconds = self._catalog_metrics
        delta.set(stats.delta_items)
        compacting.set(float(stats.compacting))
        for event in stats.compactions:
            seconds.labels(outcome=event.outcome).observe(event.seconds)

    def render(self) -> bytes:
        """Prometheus text format."""
        self._observe_catalog()
        return generate_latest(self.registry)
