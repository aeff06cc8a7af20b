"""The public engine: ``Engine(model).score(...)``; more verbs arrive with later work."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from genrec.catalog.item_table import ItemTable
from genrec.engine.batch import RequestLimits, item_rows, pack_requests
from genrec.engine.inputs import InputError, Part, build_input_embeds
from genrec.engine.params import EngineConfig, ScoreParams, ScoreRequest
from genrec.engine.scoring import read_scores
from genrec.model.checkpoint import load_model
from genrec.model.decoder import DecoderLM


class Engine:
    """Serves a decoder LM for recommendation: multi-item scoring on a shared prefix.

    The engine holds no per-request state: a rejected request leaves it as it was.
    """

    def __init__(
        self, model: DecoderLM, item_table: ItemTable | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self.model = model.eval()
        self.config = config or EngineConfig()
        self.item_table: ItemTable | None = None
        if item_table is not None:
            self.set_item_table(item_table)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: str | torch.dtype | None = None,
        device: str | torch.device = "cpu", config: EngineConfig | None = None,
    ) -> Engine:
        """Load a checkpoint directory (strictly) onto ``device`` in ``dtype``."""
        return cls(load_model(path, dtype=dtype, device=device), config=config)

    def set_item_table(self, table: ItemTable) -> None:
        """Install an item table (moved to the model's device and dtype) in one swap."""
        if table.hidden_size != self.model.config.hidden_size:
            raise ValueError(
                f"item table hidden size {table.hidden_size} does not match the model's "
                f"{self.model.config.hidden_size}"
            )
        self.item_table = table.to(self.model.device, self.model.dtype)

    def item_tokens(self, item_ids: Sequence[int]) -> list[int]:
        """Virtual token ids of catalog items, k per item, in order."""
        if self.item_table is None:
            raise ValueError("the engine has no item table")
        tokens = self.item_table.item_tokens(list(item_ids), self.model.config.vocab_size)
        return tokens.reshape(-1).tolist()

    def _limits(self) -> RequestLimits:
        cfg = self.model.config
        return RequestLimits(
            vocab_size=cfg.vocab_size, max_positions=cfg.max_position_embeddings,
            item_rows=item_rows(self.item_table), user_dim=cfg.user_dim,
            soft_token_id=self.config.soft_token_id,
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

    @torch.inference_mode()
    def score_requests(
        self, requests: Sequence[ScoreRequest], params: ScoreParams | None = None
    ) -> list[torch.Tensor]:
        """Score many users' requests, packed into as few forwards as ``max_batch_tokens``
        allows (a request is never split)."""
        params = params or ScoreParams()
        params.validate(self.model.config.vocab_size, self.model.score_head is not None)
        if not requests:
            raise InputError("requests: empty request list")
        results: list[torch.Tensor] = []
        for group in self._groups(requests):
            results.extend(self._score_group(group, params))
        return results

    def _groups(self, requests: Sequence[ScoreRequest]) -> list[list[ScoreRequest]]:
        groups: list[list[ScoreRequest]] = [[]]
        used = 0
        for req in requests:
            size = len(req.prefix) + sum(len(c) for c in req.candidates)
            if groups[-1] and used + size > self.config.max_batch_tokens:
                groups.append([])
                used = 0
            groups[-1].append(req)
            used += size
        return groups

    def _score_group(self, group: list[ScoreRequest], params: ScoreParams) -> list[torch.Tensor]:
        batch = pack_requests(
            [r.prefix for r in group], [r.candidates for r in group],
            [r.user_vector for r in group], self._limits(),
        )
        model = self.model
        embeds = build_input_embeds(
            model.model.embed_tokens, batch.inputs, self.item_table, model.user_projector
        )
        layout = batch.layout.to(model.device)
        hidden = model(embeds, layout.positions, layout)
        scores = read_scores(model, hidden, batch, params).cpu()
        return list(torch.split(scores, batch.branch_counts))
