"""Training the DuoLM teacher (full text) and student (item encoder + ranker, end to end).

A training example is a user's history and next item. Each step scores the target and
``negatives`` sampled items after the history, for ``users_per_step`` users, with the same
packing, attention layout and read-out as the engine's multi-item scoring (so training scores
are serving scores). Loss: softmax cross-entropy with the target as the label; for the student
optionally plus ``distill_weight`` x KL(teacher || student) over each candidate list, at
``temperature``, with the teacher's scores computed by the engine on the same candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from genrec.catalog.item_table import ItemTable
from genrec.data.split import Example
from genrec.duolm.cross_encoder import CrossEncoder, CrossEncoderRanker, encoder_prompts
from genrec.duolm.encoder import ItemEncoder, ItemFeatures
from genrec.duolm.prompts import SOFT_ID, YES_ID, StudentPrompts, TeacherPrompts
from genrec.duolm.ranker import ENCODER_DIR, META_FILE, TeacherRanker, rank_requests
from genrec.duolm.requests import RowRankRequest
from genrec.engine.batch import RequestLimits, item_rows, pack_requests
from genrec.engine.chunked import forward_chunked
from genrec.engine.engine import Engine
from genrec.engine.engine_config import EngineConfig
from genrec.engine.inputs import build_input_embeds
from genrec.engine.params import ScoreParams
from genrec.engine.scoring import read_scores
from genrec.evaluation.ranking import evaluate_ranking
from genrec.model.checkpoint import load_model, save_model
from genrec.model.config import ModelConfig
from genrec.model.decoder import DecoderLM
from genrec.utils.atomic import atomic_write_json


def branch_scores(
    model: DecoderLM, prefixes: Sequence[list[int]], candidates: Sequence[Sequence[list[int]]],
    yes_id: int, table: ItemTable | None = None, soft_token_id: int | None = None,
    user_vectors: Sequence[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """Differentiable log p(yes) of every candidate: [B, C] (every request has C candidates).

    The engine's own functions (pack, input embeddings, prefix + branch forward, read-out)
    do the work, so a trained model scores exactly as it will be served.
    """
    cfg = model.config
    limits = RequestLimits(cfg.vocab_size, cfg.max_position_embeddings, item_rows(table),
                           cfg.user_dim, soft_token_id)
    users = list(user_vectors) if user_vectors is not None else [None] * len(prefixes)
    batch = pack_requests(prefixes, candidates, users, limits)
    embeds = build_input_embeds(model.model.embed_tokens, batch.inputs, table,
                                model.user_projector)
    hidden = forward_chunked(model, embeds, batch, chunk_tokens=1 << 40, last_only=True)
    scores = read_scores(model, hidden, batch, ScoreParams("labels", [yes_id]))[:, 0]
    return scores.view(len(prefixes), -1)


def ranker_config(
    vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int, positions: int,
) -> ModelConfig:
    """A Qwen3-architecture ranker config (tied embeddings, MLP 3 x hidden) with room for
    ``positions`` tokens (rounded up to a multiple of 64)."""
    return ModelConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=3 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=-(-positions // 64) * 64, rope_theta=10000.0,
                       tie_word_embeddings=True)


class DuoModel(nn.Module):
    """The student's trainable parts: the ranker decoder and the item encoder."""

    def __init__(self, ranker: DecoderLM, encoder: ItemEncoder) -> None:
        super().__init__()
        self.ranker = ranker
        self.encoder = encoder

    def save_pretrained(self, path: str | Path) -> None:
        save_model(self.ranker, path)
        self.encoder.save(Path(path) / ENCODER_DIR)

    def load_weights(self, path: str | Path) -> None:
        self.ranker.load_state_dict(load_model(path).state_dict())
        self.encoder.load_state_dict(ItemEncoder.load(Path(path) / ENCODER_DIR).state_dict())


@dataclass
class RankingBatch:
    """Examples of one step and their candidate lists (target first)."""

    examples: list[Example]
    candidates: list[list[int]]


class RankingTask:
    """The :class:`genrec.training.loop_types.TrainTask` of the teacher or of the student.

    ``prompts`` decides which: :class:`TeacherPrompts` (model = a DecoderLM, or a
    :class:`CrossEncoder` for the MiniLM teacher) or :class:`StudentPrompts` (model = a
    :class:`DuoModel`, with ``features`` of every item).
    """

    def __init__(
        self, prompts: TeacherPrompts | StudentPrompts, examples: Sequence[Example],
        num_items: int, meta: dict[str, Any], features: ItemFeatures | None = None,
        negatives: int = 15, users_per_step: int = 32, seed: int = 0,
        val_examples: Sequence[Example] = (), val_candidates: Sequence[list[int]] = (),
        teacher: TeacherRanker | CrossEncoderRanker | None = None, distill_weight: float = 0.5,
        temperature: float = 1.0, progress: bool = False,
        user_vectors: torch.Tensor | None = None, user_ids: Sequence[str] | None = None,
    ) -> None:
        if not examples:
            raise ValueError("examples: no training examples")
        if negatives < 1 or negatives >= num_items:
            raise ValueError(f"negatives must be in 1..{num_items - 1}, got {negatives}")
        if not 0.0 <= distill_weight <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight}")
        self.student = isinstance(prompts, StudentPrompts)
        if self.student and features is None:
            raise ValueError("features: the student needs the item encoder's features")
        self.prompts, self.examples, self.num_items = prompts, list(examples), num_items
        self.meta, self.features, self.negatives = meta, features, negatives
        self.users_per_step, self.seed = users_per_step, seed
        self.val_examples, self.val_candidates = list(val_examples), list(val_candidates)
        self.teacher, self.distill_weight = teacher, distill_weight
        self.temperature, self.progress = temperature, progress
        self.user_vectors, self.user_ids = user_vectors, user_ids

    def num_batches(self, epoch: int) -> int:
        return -(-len(self.examples) // self.users_per_step)

    def batches(self, epoch: int) -> list[RankingBatch]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.examples), generator=gen).tolist()
        # negatives: uniform over the other items (target + 1 + r mod N never hits the target)
        offsets = torch.randint(self.num_items - 1, (len(order), self.negatives), generator=gen)
        out = []
        for s in range(0, len(order), self.users_per_step):
            idx = order[s : s + self.users_per_step]
            exs = [self.examples[i] for i in idx]
            cands = [[ex.target] + ((ex.target + 1 + offsets[s + j]) % self.num_items).tolist()
                     for j, ex in enumerate(exs)]
            out.append(RankingBatch(exs, cands))
        return out

    def shard(self, batch: RankingBatch, rank: int, world: int
              ) -> tuple[RankingBatch | None, float]:
        """Users ``rank, rank + world, ...`` of ``batch`` and their share of it (the losses
        are means over users; data-parallel training: :mod:`genrec.training.distributed`)."""
        keep = range(rank, len(batch.examples), world)
        if not keep:
            return None, 0.0
        part = RankingBatch([batch.examples[i] for i in keep],
                            [batch.candidates[i] for i in keep])
        return part, len(keep) / len(batch.examples)

    def user_vector(self, ex: Example) -> torch.Tensor | None:
        """The soft token's user vector of an example (None without soft tokens)."""
        return None if self.user_vectors is None else self.user_vectors[ex.user]

    def scores(self, model: nn.Module, batch: RankingBatch) -> torch.Tensor:
        """Training scores [B, 1 + negatives] (differentiable)."""
        soft = self.user_vectors is not None
        users = [self.user_vector(ex) for ex in batch.examples]
        if isinstance(model, CrossEncoder):
            assert isinstance(self.prompts, TeacherPrompts)
            reqs = [RowRankRequest(ex.history, cs, u)
                    for ex, cs, u in zip(batch.examples, batch.candidates, users, strict=True)]
            return torch.stack(model(*encoder_prompts(self.prompts, reqs)))
        if not self.student:
            p = self.prompts
            return branch_scores(model, [p.prefix(ex.history, soft) for ex in batch.examples],
                                 [[p.candidate(c) for c in cs] for cs in batch.candidates],
                                 p.yes_id, None, p.soft_id, users)
        assert isinstance(model, DuoModel) and self.features is not None
        items = sorted({i for ex in batch.examples for i in ex.history}
                       | {c for cs in batch.candidates for c in cs})
        local = {item: j for j, item in enumerate(items)}
        table = ItemTable(model.encoder(self.features, torch.tensor(items)))
        p = StudentPrompts(table.tokens_per_item, model.ranker.config.vocab_size,
                           self.prompts.max_history)
        return branch_scores(model.ranker,
                             [p.prefix([local[h] for h in ex.history], soft)
                              for ex in batch.examples],
                             [[p.candidate(local[c]) for c in cs] for cs in batch.candidates],
                             YES_ID, table, SOFT_ID, users)

    def loss(self, model: nn.Module, batch: RankingBatch) -> tuple[torch.Tensor, int]:
        s = self.scores(model, batch)
        target = torch.zeros(s.shape[0], dtype=torch.long, device=s.device)
        loss = F.cross_entropy(s, target)
        if self.teacher is not None and self.distill_weight > 0:
            reqs = [RowRankRequest(ex.history, cs) for ex, cs in zip(batch.examples,
                                                                  batch.candidates, strict=True)]
            t = torch.stack(self.teacher.rank_rows(reqs)).to(s.device)
            tau = self.temperature
            kd = F.kl_div(F.log_softmax(s / tau, -1), F.log_softmax(t / tau, -1),
                          log_target=True, reduction="batchmean") * tau * tau
            loss = (1 - self.distill_weight) * loss + self.distill_weight * kd
        return loss, s.numel()

    def validate(self, model: nn.Module) -> dict[str, float] | None:
        """Sampled-candidate NDCG/Recall@5/10 and MRR on the validation examples."""
        if not self.val_examples:
            return None
        rank = self.rank_fn(model)

        def score(exs: Sequence[Example], cands: Sequence[Sequence[int]]) -> list[torch.Tensor]:
            return rank([RowRankRequest(ex.history, c, self.user_vector(ex))
                         for ex, c in zip(exs, cands, strict=True)])

        return evaluate_ranking(score, self.val_examples, self.val_candidates,
                                progress=self.progress)

    def rank_fn(self, model: nn.Module):  # noqa: ANN201 - a callable over RowRankRequests
        """Ranking through the engine with the current weights (puts ``model`` in eval)."""
        if isinstance(model, CrossEncoder):
            assert isinstance(self.prompts, TeacherPrompts)
            return CrossEncoderRanker(model, self.prompts).rank_rows
        if not self.student:
            p = self.prompts
            engine = Engine(model, config=EngineConfig(soft_token_id=p.soft_id))
            return lambda reqs: rank_requests(engine, p, reqs, p.yes_id, self.num_items)
        assert isinstance(model, DuoModel) and self.features is not None
        engine = Engine(model.ranker, config=EngineConfig(soft_token_id=SOFT_ID))
        engine.set_item_table(ItemTable(model.encoder.encode_all(self.features)))
        table = engine.item_table
        p = StudentPrompts(table.tokens_per_item, model.ranker.config.vocab_size,
                           self.prompts.max_history)
        return lambda reqs: rank_requests(engine, p, reqs, YES_ID, self.num_items, table)

    def save_extra(self, directory: Path) -> None:
        """``duolm.json`` (and the user vectors, when used) beside the weights."""
        from genrec.training.user_vectors import save_user_vectors

        atomic_write_json(Path(directory) / META_FILE, self.meta)
        if self.user_vectors is not None:
            users = self.user_ids or [str(u) for u in range(self.user_vectors.shape[0])]
            save_user_vectors(directory, self.user_vectors, str(self.meta.get("user_vectors")),
                              users)



def init_text_embeddings(model: DecoderLM, std: float = 0.02) -> None:
    """Start a WordPiece-vocabulary model's token embeddings from all-MiniLM-L6-v2's, reduced
    to the hidden size by PCA (padded with noise when the hidden size is larger)."""
    from transformers import AutoModel

    from genrec.catalog.embeddings import bundled_model_path

    source = AutoModel.from_pretrained(bundled_model_path(), local_files_only=True)
    w = source.embeddings.word_embeddings.weight.detach().float()  # [V, 384]
    target = model.model.embed_tokens.weight
    if w.shape[0] != target.shape[0]:
        raise ValueError(f"vocabulary sizes differ: {w.shape[0]} vs {target.shape[0]}")
    w = w - w.mean(dim=0)
    q = min(target.shape[1], w.shape[1])
    _, _, v = torch.pca_lowrank(w, q=q, center=False)
    reduced = w @ v[:, :q]
    reduced = reduced * (std / reduced.std())
    with torch.no_grad():
        target.normal_(0.0, std)
        target[:, :q] = reduced.to(target.dtype)
