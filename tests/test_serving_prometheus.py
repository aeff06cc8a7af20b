"""The server's metrics in the Prometheus text exposition: counters, histograms, the gauges
read at each render, and the catalog's stats once there is a generative catalog."""

from __future__ import annotations

from genrec.serving.prometheus import ServerMetrics


def test_what_is_observed_shows_in_the_exposition() -> None:
    depth = [2]
    metrics = ServerMetrics(lambda: depth[0], lambda: 7, memory_budget=1024)
    metrics.observe_request("/v1/recommend", 200, 0.003)
    metrics.observe_request("/v1/recommend", 200, 0.02)
    metrics.observe_batch("score", 5, 0.01)
    metrics.observe_split()
    metrics.reject("queue_full")
    depth[0] = 4
    text = metrics.render().decode()
    for line in ('genrec_requests_total{endpoint="/v1/recommend",status="200"} 2.0',
                 'genrec_request_seconds_bucket{endpoint="/v1/recommend",le="0.005"} 1.0',
                 'genrec_batch_size_sum{kind="score"} 5.0', "genrec_batch_splits_total 1.0",
                 'genrec_rejected_total{reason="queue_full"} 1.0', "genrec_queue_depth 4.0",
                 "genrec_catalog_version 7.0", "genrec_memory_budget_bytes 1024.0"):
        assert line in text, line
    assert "genrec_catalog_delta_items" not in text  # no generative catalog's stats
