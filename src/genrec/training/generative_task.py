"""Generative-retrieval training: the task (its windows, batches and validation) and the loss.

Windows of users' training sequences are cut, tokenised and packed by
:mod:`genrec.training.windows`; a packed batch is one forward
(``build_layout(lengths, [], [])``: independent causal sequences), every Semantic-ID token of a
window's items after its first a target (teacher forcing), so every training item but a user's
first is a target exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from genrec.data.split import Example
from genrec.engine import Engine, EngineConfig
from genrec.engine.params import DEFAULT_ITEM_WEIGHT, save_item_weight
from genrec.model.config import ModelConfig
from genrec.model.decoder import DecoderLM
from genrec.training.generative_loss import ItemTeacher, batch_loss
from genrec.training.seen_items import seen_matrix
from genrec.training.windows import IGNORE, TrainBatch, make_windows, token_batches, window_tokens
from genrec.vocab.sid_vocab import SidVocab

# the item weights a finished run's final model is validated with (the best is saved with it)
ITEM_WEIGHTS = (1.0, 2.0, 3.0, 5.0, 10.0, 20.0)


class GenerativeTask:
    """The :class:`genrec.training.loop_types.TrainTask` of generative retrieval.

    ``train_sequences`` are per-user training parts (see
    :func:`genrec.data.split.training_sequences`);
    ``user_vectors`` [num_users, user_dim] switches the soft token on (with ``item_factors``
    [num_items, user_dim], each window's vector is folded in from the user's items up to the
    window's first item instead: ``svd-causal``); ``val_examples`` (history =
    training items, target = validation item) drive per-epoch Recall/NDCG via ``Engine``.
    ``texts``: per user, text token ids put before the window's Semantic IDs (None: the
    vocabulary's default text); ``extra_files`` (name -> bytes, e.g. a kept tokenizer's files)
    are written beside every checkpoint. ``mask_history``: the item head's softmax leaves out
    each user's earlier items (:mod:`genrec.training.seen_items`) and validation never
    recommends them (``val_exclude``: per validation example, the items to exclude).
    ``item_loss_weight``: the item head's cross-entropy's weight beside the Semantic IDs'.
    ``item_weights``: the ranking weights :meth:`finish` chooses from on validation (empty:
    none chosen, the engine's default). ``final_examples`` (``final_exclude`` their items to
    exclude under ``mask_history``): a larger validation sample for choosing the run's final
    model (:meth:`validate_final`, :meth:`finish`; None: ``val_examples``). ``history_bias``:
    batches carry each target's earlier items for a model whose head has a history bias.
    ``teacher``: the item head also learns the teachers' item distributions
    (:mod:`genrec.training.generative_loss`).
    """

    def __init__(
        self, vocab: SidVocab, train_sequences: Sequence[Sequence[int]],
        user_vectors: torch.Tensor | None = None, batch_tokens: int = 4096, seed: int = 0,
        val_examples: Sequence[Example] | None = None, beam_width: int = 20,
        val_batch_size: int = 128, user_ids: Sequence[str] | None = None,
        user_vector_source: str = "", progress: bool = True,
        item_factors: torch.Tensor | None = None,
        texts: Sequence[Sequence[int]] | None = None, extra_files: dict[str, bytes] | None = None,
        mask_history: bool = False, val_exclude: Sequence[Sequence[int]] | None = None,
        item_loss_weight: float = 1.0, item_weights: Sequence[float] = ITEM_WEIGHTS,
        final_examples: Sequence[Example] | None = None,
        final_exclude: Sequence[Sequence[int]] | None = None, history_bias: bool = False,
        teacher: ItemTeacher | None = None,
    ) -> None:
        self.vocab, self.user_vectors = vocab, user_vectors
        self.batch_tokens, self.seed = batch_tokens, seed
        self.val_examples = list(val_examples or [])
        self.beam_width, self.val_batch_size, self.progress = beam_width, val_batch_size, progress
        self.user_ids, self.user_vector_source = user_ids, user_vector_source
        soft = user_vectors is not None
        self.extra_files = dict(extra_files or {})
        self.mask_history, self.val_exclude, self.teacher = mask_history, val_exclude, teacher
        self.track_seen = mask_history or history_bias
        if not item_loss_weight > 0:
            raise ValueError(f"item_loss_weight must be > 0, got {item_loss_weight}")
        self.item_loss_weight, self.item_weights = item_loss_weight, tuple(item_weights)
        if val_exclude is not None and len(val_exclude) != len(self.val_examples):
            raise ValueError(f"val_exclude: {len(val_exclude)} lists for "
                             f"{len(self.val_examples)} validation examples")
        self.final_examples, self.final_exclude = self.val_examples, val_exclude
        if final_examples is not None:
            self.final_examples, self.final_exclude = list(final_examples), final_exclude
        if final_exclude is not None and len(final_exclude) != len(self.final_examples):
            raise ValueError(f"final_exclude: {len(final_exclude)} lists for "
                             f"{len(self.final_examples)} examples")
        self.priors: list[torch.Tensor] = []  # per window: the user's items before its last
        if texts is not None and len(texts) != len(train_sequences):
            raise ValueError(f"texts: {len(texts)} entries for {len(train_sequences)} users")
        self.users: list[int] = []
        self.ids: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.item_labels: list[torch.Tensor] = []
        seen: list[list[int]] = []  # per window: the user's items up to its first item
        for user, seq in enumerate(train_sequences):
            vocab.check_items(list(seq), f"train_sequences[{user}]")
            text = None if texts is None else list(texts[user])
            if text is not None:
                vocab.check_text(text, f"texts[{user}]")
            start = 0  # windows tile the sequence from its start, overlapping by one item
            whole = torch.tensor(list(seq), dtype=torch.long)
            for window in make_windows(seq, vocab.max_history):
                ids, labels, item_labels = window_tokens(vocab, window, soft, text)
                self.users.append(user)
                self.ids.append(torch.tensor(ids))
                self.labels.append(torch.tensor(labels))
                self.item_labels.append(torch.tensor(item_labels))
                seen.append(list(seq[: start + 1]))
                if self.track_seen:
                    self.priors.append(whole[: start + len(window) - 1])  # a view
                start += len(window) - 1
        if not self.ids:
            raise ValueError("train_sequences: no user has two or more training items")
        # svd-causal: each window's user vector holds none of its targets
        self.item_factors = item_factors if soft else None
        self.window_vectors = None
        if self.item_factors is not None:
            from genrec.training.user_vectors import fold_in

            self.window_vectors = fold_in(self.item_factors, seen)
        self.firsts = [len(s) for s in seen]
        self.lengths = [t.numel() for t in self.ids]
        self.num_targets = sum(int((t != IGNORE).sum()) for t in self.labels)
        self._plan: tuple[int, list[list[int]]] | None = None
        self._engine: Engine | None = None

    def _batches_of(self, epoch: int) -> list[list[int]]:
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, token_batches(self.lengths, self.batch_tokens, self.seed, epoch))
        return self._plan[1]

    def num_batches(self, epoch: int) -> int:
        """Optimizer steps of ``epoch``."""
        return len(self._batches_of(epoch))

    def batches(self, epoch: int) -> Iterator[TrainBatch]:
        """The packed batches of ``epoch`` (deterministic in seed and epoch)."""
        for idx in self._batches_of(epoch):
            ids = torch.cat([self.ids[i] for i in idx])
            soft_rows = torch.nonzero(ids == self.vocab.soft_id)[:, 0] \
                if self.user_vectors is not None else torch.zeros(0, dtype=torch.long)
            vectors = None
            if self.window_vectors is not None:
                vectors = self.window_vectors[torch.tensor(idx)]
            elif self.user_vectors is not None:
                vectors = self.user_vectors[torch.tensor([self.users[i] for i in idx])]
            seen = seen_matrix([self.priors[i] for i in idx], [self.firsts[i] for i in idx]) \
                if self.track_seen else None
            yield TrainBatch(ids, torch.cat([self.labels[i] for i in idx]),
                             [self.lengths[i] for i in idx], soft_rows, vectors,
                             self.vocab.soft_id, torch.cat([self.item_labels[i] for i in idx]),
                             seen)

    def loss(self, model: DecoderLM, batch: TrainBatch) -> tuple[torch.Tensor, int]:
        """(mean loss, tokens processed)."""
        return (batch_loss(model, batch, self.vocab, self.item_loss_weight, self.teacher),
                batch.num_tokens)

    def shard(self, batch: TrainBatch, rank: int, world: int) -> tuple[TrainBatch | None, float]:
        """Windows ``rank, rank + world, ...`` of ``batch`` and their share of its targets
        (data-parallel training: :mod:`genrec.training.distributed`)."""
        keep = list(range(rank, len(batch.lengths), world))
        if not keep:
            return None, 0.0
        part = batch.windows(keep)
        mine = int((part.labels != IGNORE).sum())
        if not mine:
            return None, 0.0
        return part, mine / int((batch.labels != IGNORE).sum())

    def validate(self, model: DecoderLM, item_weight: float | None = None
                 ) -> dict[str, float] | None:
        """Recall/NDCG@5/10 on the validation examples (ranked with ``item_weight``, None: the
        engine's default); None when there are none."""
        return self._evaluate(model, self.val_examples, self.val_exclude, item_weight)

    @property
    def final_validation(self) -> Callable[[DecoderLM], dict[str, float] | None] | None:
        """The validation the run's final model is chosen with where it differs from the
        epochs' (:meth:`validate_final` on a separate sample); None: :meth:`validate`."""
        return self.validate_final if self.final_examples is not self.val_examples else None

    def validate_final(self, model: DecoderLM) -> dict[str, float] | None:
        """:meth:`validate` on the final-choice sample (``final_examples``)."""
        return self._evaluate(model, self.final_examples, self.final_exclude)

    def _evaluate(self, model: DecoderLM, examples: list[Example],
                  exclude: Sequence[Sequence[int]] | None, item_weight: float | None = None
                  ) -> dict[str, float] | None:
        from genrec.evaluation.full_catalog import evaluate_generative

        if not examples:
            return None
        return evaluate_generative(
            self._engine_of(model), examples, self.user_vectors, beam_width=self.beam_width,
            batch_size=self.val_batch_size, progress=self.progress,
            exclude=exclude if self.mask_history else None, item_weight=item_weight,
        )

    def _engine_of(self, model: DecoderLM) -> Engine:
        if self._engine is None or self._engine.model is not model:
            self._engine = Engine(model, config=EngineConfig(soft_token_id=self.vocab.soft_id),
                                  vocab=self.vocab)
        return self._engine

    def finish(self, model: DecoderLM, folder: Path) -> dict:
        """For a model with an item head: validate the run's final ``model`` (saved in
        ``folder``) on the final-choice sample ranked with each of ``item_weights`` (one
        search: :func:`evaluate_item_weights`), save the best by NDCG@10 in the folder's
        ``generation_config.json`` (what the engine then ranks with by default; a tie keeps
        :data:`DEFAULT_ITEM_WEIGHT`) and return ``{"item_weight": best, "item_weights":
        {weight: NDCG@10}}``; ``{}`` otherwise."""
        from genrec.evaluation.full_catalog import evaluate_item_weights

        if model.item_head is None or not self.final_examples or not self.item_weights:
            return {}
        by_weight = evaluate_item_weights(
            self._engine_of(model.eval()), self.final_examples, self.item_weights,
            self.user_vectors, beam_width=self.beam_width, batch_size=self.val_batch_size,
            progress=self.progress, exclude=self.final_exclude if self.mask_history else None)
        ndcg = {w: m["ndcg@10"] for w, m in by_weight.items()}
        best = max(ndcg, key=lambda w: (ndcg[w], w == DEFAULT_ITEM_WEIGHT))
        save_item_weight(folder, best)
        return {"item_weight": best, "item_weights": {str(w): v for w, v in ndcg.items()}}

    def save_extra(self, directory: Path) -> None:
        """The SidVocab (the user vectors, when used, and the extra files) beside the model
        weights."""
        from genrec.training.user_vectors import save_item_factors, save_user_vectors
        from genrec.utils.atomic import atomic_write

        self.vocab.save(directory)
        for name, data in self.extra_files.items():
            atomic_write(Path(directory) / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
        if self.user_vectors is not None:
            users = self.user_ids or [str(u) for u in range(self.user_vectors.shape[0])]
            save_user_vectors(directory, self.user_vectors, self.user_vector_source, users)
        if self.item_factors is not None:
            save_item_factors(directory, self.item_factors)


def scratch_config(
    vocab: SidVocab, hidden: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2,
    head_dim: int = 32, intermediate: int | None = None, user_dim: int = 0,
    item_head: bool = False, item_inputs: bool = False, item_compose: bool = False,
    history_bias: bool = False, item_dim: int = 0,
) -> ModelConfig:
    """A Qwen3-architecture config over exactly the SID vocabulary, with tied embeddings and
    enough positions for a full prompt plus one generated item (``item_head``: a dense item
    head over the index's items; ``item_inputs``: its embeddings also on the input;
    ``item_compose``: the head's item vectors include their Semantic-ID tokens' embeddings;
    ``history_bias``: the head learns a bias for the user's own items; ``item_dim``: the size of
    the head's item rows, 0 for the hidden size)."""
    longest = 2 + (vocab.max_history + 1) * vocab.num_levels
    return ModelConfig(
        architecture="Qwen3ForCausalLM", vocab_size=vocab.vocab_size, hidden_size=hidden,
        intermediate_size=intermediate or 3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=-(-longest // 64) * 64, rope_theta=10000.0,
        tie_word_embeddings=True, user_dim=user_dim,
        item_head=vocab.index.num_items if item_head else 0,
        item_inputs=vocab.num_levels if item_inputs else 0, item_compose=item_compose,
        history_bias=history_bias, item_dim=item_dim,
    )


def set_item_tokens(model: DecoderLM, vocab: SidVocab) -> None:
    """Give a model with item inputs the Semantic-ID tokens of the index's items."""
    head = model.item_head
    if head is not None and head.item_inputs:
        head.set_item_tokens(vocab.item_tokens(torch.arange(vocab.index.num_items)))
