"""Multi-item scoring: ``ScoringEngine(model).score(...)`` scores many candidates of one
user after a prefix computed once, prepared on the host, then run; the base of
:class:`genrec.engine.engine.Engine`, which adds generative retrieval."""

from __future__ import annotations

import gc
from collections.abc import Sequence

import torch

from genrec.catalog.item_table import ItemTable
from genrec.engine.batch import (
    PackedBatch,
    RequestLimits,
    item_rows,
    pack_requests,
    token_groups,
)
from genrec.engine.chunked import forward_chunked
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import InputError, Part, build_input_embeds
from genrec.engine.memory import take_budget
from genrec.engine.params import ScoreParams
from genrec.engine.requests import ScoreRequest
from genrec.engine.runner_pool import RunnerPool, runner_config
from genrec.engine.score_runner import ScoreRunnerPool
from genrec.engine.scoring import PreparedScore, read_scores
from genrec.kernels import cascade_attention_op
from genrec.model.decoder import DecoderLM
from genrec.utils.allocator import keep_freed_memory
from genrec.utils.device_lock import DeviceLock


class ScoringEngine:
    """Serves a decoder LM for multi-item scoring on a shared prefix (:meth:`score`), with
    the device state every engine holds: the memory budget taken when it is built
    (:attr:`memory`, :mod:`genrec.engine.memory`), the static search buffers
    (:attr:`searches`, kept within half of it) and the scoring grids that share their
    capture lock and graph pool (:attr:`scorers`), and the installed item table.

    It holds no per-request state: a rejected request leaves it as it was.
    """

    def __init__(
        self, model: DecoderLM, item_table: ItemTable | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self.model = model.eval()
        self.config = config or EngineConfig()
        if self.model.device.type == "cpu":
            keep_freed_memory()  # activations reused across forwards, not re-faulted
            cascade_attention_op()  # built (once per machine) now, not in the first request
        self.item_table: ItemTable | None = None
        # taken once, after the weights are on the device (logged)
        self.memory = take_budget(self.model.device, self.config.memory_fraction,
                                  self.config.memory_budget_bytes)
        self.searches = RunnerPool(self.model, runner_config(self.config, self.model.device,
                                                             self.memory))
        # scoring grids share the searches' settings, capture lock and graph pool; on by
        # default on CUDA only (on the CPU the packed path is faster)
        on = self.config.score_runners
        self.scorers = ScoreRunnerPool(self.model, self.searches,
                                       on if on is not None else self.model.device.type == "cuda")
        if item_table is not None:
            self.set_item_table(item_table)

    def pack(
        self, prefixes: Sequence[Part], branches: Sequence[Sequence[Part]],
        user_vectors: Sequence[object | None], require_branches: bool = True,
        item_table: ItemTable | None = None,
    ) -> PackedBatch:
        """Validate and pack requests against this engine's model and ``item_table``
        (default: the installed one)."""
        return pack_requests(prefixes, branches, user_vectors,
                             self.request_limits(item_table or self.item_table),
                             require_branches=require_branches)

    def embed(self, batch: PackedBatch, item_table: ItemTable | None = None) -> torch.Tensor:
        """Input embeddings [T, hidden] of a packed batch, on the model's device."""
        model = self.model
        return build_input_embeds(
            model.model.embed_tokens, batch.inputs, item_table or self.item_table,
            model.user_projector, model.item_head,
        )

    def device_work(self) -> DeviceLock:
        """The lock of the engine's device (a context manager): hold it around device work
        that may run beside the engine's batches, so that it never overlaps a CUDA graph
        capture (:mod:`genrec.utils.device_lock`)."""
        return self.searches.capture_lock

    def held_bytes(self) -> int:
        """Bytes the engine keeps between calls: its search buffers and scoring grids."""
        return self.searches.stats().bytes + self.scorers.nbytes()

    def release_caches(self) -> None:
        """Drop the kept search buffers, scoring grids and their graphs, and hand the freed
        device memory back (after an out-of-memory error; the next call makes them again)."""
        self.searches.release()
        self.scorers.release()
        gc.collect()
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()

    def set_item_table(self, table: ItemTable) -> None:
        """Install an item table (moved to the model's device and dtype) in one swap.

        Each scoring call reads the installed table once, so a call running during a swap
        uses the old table or the new one throughout, never a mix.
        """
        self.item_table = self.prepare_table(table)

    def prepare_table(self, table: ItemTable) -> ItemTable:
        """``table`` checked against the model and moved to its device and dtype."""
        if table.hidden_size != self.model.config.hidden_size:
            raise ValueError(
                f"item table hidden size {table.hidden_size} does not match the model's "
                f"{self.model.config.hidden_size}"
            )
        return table.to(self.model.device, self.model.dtype)

    def item_tokens(self, item_ids: Sequence[int]) -> list[int]:
        """Virtual token ids of catalog items, k per item, in order."""
        if self.item_table is None:
            raise ValueError("the engine has no item table")
        tokens = self.item_table.item_tokens(list(item_ids), self.model.config.vocab_size)
        return tokens.reshape(-1).tolist()

    def request_limits(self, table: ItemTable | None) -> RequestLimits:
        """What a request may hold against this model and ``table``."""
        cfg = self.model.config
        return RequestLimits(
            vocab_size=cfg.vocab_size, max_positions=cfg.max_position_embeddings,
            item_rows=item_rows(table), user_dim=cfg.user_dim,
            soft_token_id=self.config.soft_token_id,
            item_active=table.active if table is not None else None,
            tokens_per_item=table.tokens_per_item if table is not None else 1,
        )

    def score(
        self, prefix: Part, candidates: Sequence[Part], params: ScoreParams | None = None,
        user_vector: torch.Tensor | Sequence[float] | None = None,
    ) -> torch.Tensor:
        """Score ``candidates`` after one user's ``prefix`` in one request.

        The prefix is computed once; each candidate sees the prefix and itself only, with
        positions continuing from the prefix, so its score does not depend on the others.
        Returns [N, K] log-probs/probs in 'labels' mode, [N] otherwise (CPU, fp32).
        """
        request = ScoreRequest(prefix=prefix, candidates=candidates, user_vector=user_vector)
        return self.score_requests([request], params)[0]

    def score_requests(
        self, requests: Sequence[ScoreRequest], params: ScoreParams | None = None,
        item_table: ItemTable | None = None,
    ) -> list[torch.Tensor]:
        """Score many users' requests, packed into as few forwards as ``max_batch_tokens``
        allows (a request is never split). Virtual item tokens read ``item_table`` (already
        prepared with :meth:`prepare_table`), by default the installed table, read once."""
        return self.run_score(self.prepare_score(requests, params, item_table))

    def prepare_score(
        self, requests: Sequence[ScoreRequest], params: ScoreParams | None = None,
        item_table: ItemTable | None = None,
    ) -> PreparedScore:
        """The host part of :meth:`score_requests`: checks (``InputError`` naming the part)
        and packing; :meth:`run_score` runs it."""
        params = params or ScoreParams()
        params.validate(self.model.config.vocab_size, self.model.score_head is not None)
        if not requests:
            raise InputError("requests: empty request list")
        table = item_table or self.item_table
        batches = [self.pack([r.prefix for r in group], [r.candidates for r in group],
                             [r.user_vector for r in group], item_table=table)
                   for group in token_groups(requests, self.config.max_batch_tokens)]
        return PreparedScore(params, table, batches)

    @torch.inference_mode()
    def run_score(self, prepared: PreparedScore) -> list[torch.Tensor]:
        """The forwards of a :meth:`prepare_score` batch: one score tensor per request (CPU,
        fp32)."""
        model, params = self.model, prepared.params
        results: list[torch.Tensor] = []
        for batch in prepared.batches:
            embeds = self.embed(batch, prepared.table)
            grid = self.scorers.key(batch, params)
            if grid is not None:  # one length of candidates: a fixed grid (a graph on CUDA)
                scores = self.scorers.score(grid, batch, embeds).cpu()
            else:
                hidden = forward_chunked(model, embeds, batch, self.config.chunk_tokens,
                                         last_only=params.mode != "loglik")
                scores = read_scores(model, hidden, batch, params).cpu()
            results.extend(torch.split(scores, batch.branch_counts))
        return results
