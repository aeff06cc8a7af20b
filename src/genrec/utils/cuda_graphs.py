"""Capturing a step runner's work as a CUDA graph (CUDA only; callers guard it)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture(step: Callable[[], None], pool: object | None = None) -> torch.cuda.CUDAGraph:
    """``step`` (which writes its results into buffers allocated before) run once on a side
    stream to warm up (weights packed lazily, kernels chosen), then captured as a graph in
    memory ``pool`` (shared by an engine's graphs: they never run at once). Replay the graph
    to run ``step`` again over the same buffers."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        step()
    return graph
