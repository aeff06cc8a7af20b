"""The Engine's settings (:class:`EngineConfig`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """Engine settings.

    ``soft_token_id``: the placeholder replaced by the user's soft token. ``max_batch_tokens``:
    requests packed into one scoring batch. ``chunk_tokens``: branches run in chunks of this
    many tokens after their prefixes (activations stay in cache; memory stays bounded).

    Beam search runs on static buffers per search shape (``genrec.engine.runner_pool``):
    ``cuda_graphs`` captures each as a CUDA graph on a GPU (``False``: the same runners,
    eager); ``search_request_buckets`` are the request counts a search is padded to (default:
    powers of two up to 64 on CUDA, none on the CPU, where padding only costs);
    ``static_search``: runners read the catalog and filter lists from capacity-sized copies,
    so one runner (one graph) serves every catalog version and filter size that fits
    (``genrec.engine.static_search``; default: with CUDA graphs). ``max_search_runners``
    runners and buffers up to half the memory budget are kept (least
    recently used dropped). The memory budget (``genrec.engine.memory``) is
    ``memory_fraction`` of the memory free when the engine is built (the device's; RAM on the
    CPU), or ``memory_budget_bytes`` where given; requests are admitted against it.
    ``score_runners``: scoring batches whose
    candidates have one length run on fixed grids (``genrec.engine.score_runner``; captured
    too with ``cuda_graphs``); default: on CUDA only. ``item_weight``: the item head's weight
    in ranking for requests that give none (``BeamParams.item_weight``); default: the one
    saved with the model (``generation_config.json``, chosen on validation when trained),
    else :data:`genrec.engine.params.DEFAULT_ITEM_WEIGHT`.
    """

    max_batch_tokens: int = 65536
    soft_token_id: int | None = None
    chunk_tokens: int = 4096
    cuda_graphs: bool = True
    search_request_buckets: tuple[int, ...] | None = None
    max_search_runners: int = 8
    static_search: bool | None = None
    memory_fraction: float = 0.8
    memory_budget_bytes: int | None = None
    score_runners: bool | None = None
    item_weight: float | None = None
