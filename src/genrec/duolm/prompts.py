"""Prompts of the DuoLM student ranker and of its full-text teacher.

Both rankers score a candidate with the log-probability of the ``yes`` token at the candidate's
last position: the engine's ``labels`` mode with ``label_token_ids=[yes]``,
which any LM engine (vLLM's ``logprob_token_ids`` included) can compute too.

Student (virtual item tokens; ids >= ``vocab_size`` index the item table, k rows per item)::

    prefix    = bos [soft] items(h_1) [fb_1] ... items(h_n) [fb_n] sep
    candidate = items(c)            (read at its last item token: k tokens per candidate)

Teacher (text tokens of a WordPiece tokenizer)::

    prefix    = [CLS] [soft] title(h_1) [SEP] ... title(h_n) [SEP]
    candidate = full_text(c) score

Training, evaluation, serving and the benchmark build prompts with these functions only.
Histories longer than ``max_history`` keep their last ``max_history`` items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from genrec.catalog.embeddings import bundled_model_path, format_item_text

# Student vocabulary: a few special tokens, then feedback tokens; item tokens come after.
# SCORE_ID is reserved (unused since candidates are read at their last item token): kept so
# that the ids after it, and trained checkpoints, stay valid.
PAD_ID, BOS_ID, SOFT_ID, SEP_ID, SCORE_ID, YES_ID, NO_ID = range(7)
FEEDBACK = ("rating_1", "rating_2", "rating_3", "rating_4", "rating_5", "like", "skip")
FEEDBACK_BASE = 7
STUDENT_VOCAB_SIZE = 16  # 7 specials + 7 feedback tokens, rounded up
NO_TEXT = "(no text)"


def feedback_id(name: str) -> int:
    """Token id of a feedback value (``rating_1`` .. ``rating_5``, ``like``, ``skip``)."""
    if name not in FEEDBACK:
        raise ValueError(f"feedback: unknown value {name!r}; expected one of {list(FEEDBACK)}")
    return FEEDBACK_BASE + FEEDBACK.index(name)


def truncate_history(history: Sequence[int], max_history: int) -> list[int]:
    """The last ``max_history`` items (all of them when ``max_history`` is 0)."""
    items = list(history)
    return items[-max_history:] if max_history else items


@dataclass
class StudentPrompts:
    """Student prompts over an item table of ``k`` rows per item after ``vocab_size``."""

    k: int = 2
    vocab_size: int = STUDENT_VOCAB_SIZE
    max_history: int = 20

    def item_tokens(self, item: int) -> list[int]:
        start = self.vocab_size + item * self.k
        return list(range(start, start + self.k))

    def prefix(
        self, history: Sequence[int], soft: bool = False,
        feedback: Sequence[str | None] | None = None,
    ) -> list[int]:
        """``bos [soft] items(h_1) [fb_1] ... sep`` over the last ``max_history`` items."""
        if feedback is not None and len(feedback) != len(history):
            raise ValueError(
                f"feedback: {len(feedback)} values for a history of {len(history)} items"
            )
        keep = len(truncate_history(history, self.max_history))
        items = list(history)[len(history) - keep:]
        fbs = list(feedback)[len(history) - keep:] if feedback is not None else [None] * keep
        out = [BOS_ID] + ([SOFT_ID] if soft else [])
        for item, fb in zip(items, fbs, strict=True):
            out += self.item_tokens(item)
            if fb is not None:
                out.append(feedback_id(fb))
        return out + [SEP_ID]

    def candidate(self, item: int) -> list[int]:
        """``items(c)``: the candidate's k virtual tokens; the score is read at the last one,
        so a candidate costs k tokens (no separate score token)."""
        return self.item_tokens(item)


@dataclass
class TeacherPrompts:
    """Teacher prompts from pre-tokenized item text.

    ``titles[i]`` / ``texts[i]``: token ids of item i's title and of its full text (title,
    brand, categories, description), already truncated. Build with :meth:`from_items`.
    """

    titles: list[list[int]]
    texts: list[list[int]]
    bos_id: int
    sep_id: int
    soft_id: int
    score_id: int
    yes_id: int
    vocab_size: int
    max_history: int = 20
    empty_items: list[int] = field(default_factory=list)

    @classmethod
    def from_items(
        cls, item_text: Mapping[int, Mapping[str, str]], num_items: int,
        tokenizer_path: str | None = None, max_title_tokens: int = 24,
        max_text_tokens: int = 128, max_history: int = 20,
    ) -> TeacherPrompts:
        """Tokenize every item's title and full text with the bundled MiniLM WordPiece
        tokenizer (or the one at ``tokenizer_path``). Items without any text read
        ``"(no text)"``; their ids are kept in ``empty_items``."""
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path or bundled_model_path(),
                                            local_files_only=True)
        records = [item_text.get(i, {}) for i in range(num_items)]
        full = [format_item_text(r) for r in records]
        empty = [i for i, t in enumerate(full) if not t]
        full = [t or NO_TEXT for t in full]
        titles = [str(r.get("title", "")).strip() or full[i][:200] for i, r in enumerate(records)]
        enc = dict(add_special_tokens=False, truncation=True)
        title_ids = tok(titles, max_length=max_title_tokens, **enc)["input_ids"]
        text_ids = tok(full, max_length=max_text_tokens, **enc)["input_ids"]
        unused = tok.convert_tokens_to_ids(["[unused1]", "[unused2]", "[unused3]"])
        return cls(
            titles=[list(t) for t in title_ids], texts=[list(t) for t in text_ids],
            bos_id=int(tok.cls_token_id), sep_id=int(tok.sep_token_id), soft_id=unused[0],
            score_id=unused[1], yes_id=unused[2], vocab_size=len(tok),
            max_history=max_history, empty_items=empty,
        )

    @property
    def num_items(self) -> int:
        return len(self.texts)

    def prefix(self, history: Sequence[int], soft: bool = False) -> list[int]:
        """``[CLS] [soft] title(h_1) [SEP] ... title(h_n) [SEP]``."""
        out = [self.bos_id] + ([self.soft_id] if soft else [])
        for item in truncate_history(history, self.max_history):
            out += self.titles[item] + [self.sep_id]
        return out

    def candidate(self, item: int) -> list[int]:
        """``full_text(c) score``."""
        return self.texts[item] + [self.score_id]

