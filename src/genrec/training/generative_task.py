"""Generative-retrieval training data and loss: windows of users' training sequences.

Each user's training part (leave-one-out: all but the last two items) is cut into windows of
up to ``max_history + 1`` items, consecutive windows sharing one item, the last window ending at
the user's last training item. A window is one causal sequence ``SidVocab.prompt(window)``
(``bos [soft] [text] sid(i_1) ... sid(i_n)``, the same function serving uses; text only with
a vocabulary extending a pretrained LM's, see :mod:`genrec.training.extend_vocab`) and every
Semantic-ID token of items ``i_2 .. i_n`` is a target (teacher forcing), so a forward gives
many targets and every training item but a user's first is a target exactly once. Windows are
packed into one forward per step (``build_layout(lengths, [], [])``: independent causal
sequences).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from genrec.data.split import Example
from genrec.engine import Engine, EngineConfig
from genrec.engine.inputs import PackedInputs, build_input_embeds
from genrec.model.config import ModelConfig
from genrec.model.decoder import DecoderLM
from genrec.model.item_head import item_loss
from genrec.model.layout import build_layout
from genrec.training.extend_vocab import level_loss
from genrec.vocab.sid_vocab import SOFT_ID, SidVocab

IGNORE = -100


def make_windows(items: Sequence[int], max_history: int) -> list[list[int]]:
    """Windows of up to ``max_history + 1`` items, oldest first; consecutive windows overlap by
    one item and the last one ends at ``items[-1]``. Windows of one item (no target) are dropped."""
    if max_history < 1:
        raise ValueError(f"max_history must be >= 1, got {max_history}")
    windows, end = [], len(items)
    while end >= 2:
        start = max(0, end - max_history - 1)
        windows.append(list(items[start:end]))
        end = start + 1
    return windows[::-1]


def window_tokens(vocab: SidVocab, items: Sequence[int], soft_token: bool,
                  text: Sequence[int] | None = None) -> tuple[list, list, list]:
    """Token ids of a window's prompt (``text``: see :meth:`SidVocab.prompt`), its labels
    (next-token targets, -100 = no loss) and its item labels (the next item at each row that
    predicts an item's first Semantic ID, for the item head; -100 elsewhere)."""
    ids = vocab.prompt(items, soft_token=soft_token, truncate=False, text=text)
    first_target = len(vocab.head(soft_token, text)) + vocab.num_levels  # first token of item 2
    labels = [IGNORE] * len(ids)
    labels[first_target - 1 : -1] = ids[first_target:]
    item_labels = [IGNORE] * len(ids)
    for j, item in enumerate(items[1:]):  # the row before item j+2's first Semantic ID
        item_labels[first_target - 1 + j * vocab.num_levels] = int(item)
    return ids, labels, item_labels


@dataclass
class TrainBatch:
    """Packed windows: ``token_ids``/``labels`` [T], one length per window, soft-token rows [S]
    and their user vectors [S, user_dim] (None without soft tokens)."""

    token_ids: torch.Tensor
    labels: torch.Tensor
    lengths: list[int]
    soft_rows: torch.Tensor
    user_vectors: torch.Tensor | None
    soft_id: int = SOFT_ID
    item_labels: torch.Tensor | None = None  # [T], for a model with an item head

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    def windows(self, keep: Sequence[int]) -> TrainBatch:
        """The batch of windows ``keep`` only (in that order)."""
        ends = torch.cumsum(torch.tensor(self.lengths), 0).tolist()
        starts = [e - n for e, n in zip(ends, self.lengths, strict=True)]
        rows = torch.cat([torch.arange(starts[w], ends[w]) for w in keep]) if keep else \
            torch.zeros(0, dtype=torch.long)
        ids = self.token_ids[rows]
        soft = torch.nonzero(ids == self.soft_id)[:, 0] if self.soft_rows.numel() else \
            self.soft_rows
        vectors = None if self.user_vectors is None else self.user_vectors[list(keep)]
        items = None if self.item_labels is None else self.item_labels[rows]
        return TrainBatch(ids, self.labels[rows], [self.lengths[w] for w in keep], soft, vectors,
                          self.soft_id, items)


def batch_loss(model: DecoderLM, batch: TrainBatch, vocab: SidVocab | None = None
               ) -> torch.Tensor:
    """Mean cross-entropy over the batch's targets, normalised as the engine scores: over the
    full vocabulary, or over each target's level (``sid_normalize="level"``; needs ``vocab``);
    with an item head, plus its mean cross-entropy over all items at the batch's item labels."""
    device = model.device
    inputs = PackedInputs(
        token_ids=batch.token_ids, raw_rows=torch.zeros(0, dtype=torch.long), raw_embeds=None,
        soft_rows=batch.soft_rows, user_vectors=batch.user_vectors,
    )
    # the soft token enters exactly as at serving: projector(user vector) at the soft rows
    embeds = build_input_embeds(model.model.embed_tokens, inputs, None, model.user_projector,
                                model.item_head)
    layout = build_layout(batch.lengths, [], []).to(device)
    hidden = model(embeds, layout.positions, layout)  # [T, hidden]
    labels = batch.labels.to(device)
    rows = labels != IGNORE
    if model.config.sid_normalize == "level":
        if vocab is None:
            raise ValueError("vocab: a level-normalised model's loss needs its SidVocab")
        loss = level_loss(model, hidden[rows], labels[rows], vocab)
    else:
        loss = F.cross_entropy(model.logits(hidden[rows]), labels[rows])
    if model.item_head is not None:
        if batch.item_labels is None:
            raise ValueError("batch.item_labels: a model with an item head needs them")
        items = batch.item_labels.to(device)
        at = items != IGNORE
        loss = loss + item_loss(model.item_head, hidden[at], items[at])
    return loss


def token_batches(
    lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int, pool: int = 32,
) -> list[list[int]]:
    """Seeded batches of window indices, each up to ``batch_tokens`` tokens (a longer window is
    a batch of its own). Same (seed, epoch) -> same batches.

    Windows are shuffled, then grouped by length inside pools of about ``pool`` batches (the
    attention pads every sequence of a batch to the longest one), and the batches shuffled.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=gen).tolist()
    batches: list[list[int]] = []
    start = 0
    while start < len(order):
        end, used = start, 0
        while end < len(order) and used < pool * batch_tokens:
            used, end = used + lengths[order[end]], end + 1
        group = sorted(order[start:end], key=lengths.__getitem__)
        start = end
        current: list[int] = []
        used = 0
        for i in group:
            if current and used + lengths[i] > batch_tokens:
                batches.append(current)
                current, used = [], 0
            current.append(i)
            used += lengths[i]
        batches.append(current)
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


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
    are written beside every checkpoint.
    """

    def __init__(
        self, vocab: SidVocab, train_sequences: Sequence[Sequence[int]],
        user_vectors: torch.Tensor | None = None, batch_tokens: int = 4096, seed: int = 0,
        val_examples: Sequence[Example] | None = None, beam_width: int = 20,
        val_batch_size: int = 128, user_ids: Sequence[str] | None = None,
        user_vector_source: str = "", progress: bool = True,
        item_factors: torch.Tensor | None = None,
        texts: Sequence[Sequence[int]] | None = None, extra_files: dict[str, bytes] | None = None,
    ) -> None:
        self.vocab, self.user_vectors = vocab, user_vectors
        self.batch_tokens, self.seed = batch_tokens, seed
        self.val_examples = list(val_examples or [])
        self.beam_width, self.val_batch_size, self.progress = beam_width, val_batch_size, progress
        self.user_ids, self.user_vector_source = user_ids, user_vector_source
        soft = user_vectors is not None
        self.extra_files = dict(extra_files or {})
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
            for window in make_windows(seq, vocab.max_history):
                ids, labels, item_labels = window_tokens(vocab, window, soft, text)
                self.users.append(user)
                self.ids.append(torch.tensor(ids))
                self.labels.append(torch.tensor(labels))
                self.item_labels.append(torch.tensor(item_labels))
                seen.append(list(seq[: start + 1]))
                start += len(window) - 1
        if not self.ids:
            raise ValueError("train_sequences: no user has two or more training items")
        # svd-causal: each window's user vector holds none of its targets
        self.item_factors = item_factors if soft else None
        self.window_vectors = None
        if self.item_factors is not None:
            from genrec.training.user_vectors import fold_in

            self.window_vectors = fold_in(self.item_factors, seen)
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
            yield TrainBatch(ids, torch.cat([self.labels[i] for i in idx]),
                             [self.lengths[i] for i in idx], soft_rows, vectors,
                             self.vocab.soft_id, torch.cat([self.item_labels[i] for i in idx]))

    def loss(self, model: DecoderLM, batch: TrainBatch) -> tuple[torch.Tensor, int]:
        """(mean loss, tokens processed)."""
        return batch_loss(model, batch, self.vocab), batch.num_tokens

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

    def validate(self, model: DecoderLM) -> dict[str, float] | None:
        """Recall/NDCG@5/10 on the validation examples; None when there are none."""
        from genrec.evaluation.full_catalog import evaluate_generative

        if not self.val_examples:
            return None
        if self._engine is None or self._engine.model is not model:
            self._engine = Engine(model, config=EngineConfig(soft_token_id=self.vocab.soft_id),
                                  vocab=self.vocab)
        return evaluate_generative(
            self._engine, self.val_examples, self.user_vectors, beam_width=self.beam_width,
            batch_size=self.val_batch_size, progress=self.progress,
        )

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
    item_head: bool = False, item_inputs: bool = False,
) -> ModelConfig:
    """A Qwen3-architecture config over exactly the SID vocabulary, with tied embeddings and
    enough positions for a full prompt plus one generated item (``item_head``: a dense item
    head over the index's items; ``item_inputs``: its embeddings also on the input)."""
    longest = 2 + (vocab.max_history + 1) * vocab.num_levels
    return ModelConfig(
        architecture="Qwen3ForCausalLM", vocab_size=vocab.vocab_size, hidden_size=hidden,
        intermediate_size=intermediate or 3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=-(-longest // 64) * 64, rope_theta=10000.0,
        tie_word_embeddings=True, user_dim=user_dim,
        item_head=vocab.index.num_items if item_head else 0,
        item_inputs=vocab.num_levels if item_inputs else 0,
    )


def set_item_tokens(model: DecoderLM, vocab: SidVocab) -> None:
    """Give a model with item inputs the Semantic-ID tokens of the index's items."""
    head = model.item_head
    if head is not None and head.item_inputs:
        head.set_item_tokens(vocab.item_tokens(torch.arange(vocab.index.num_items)))
