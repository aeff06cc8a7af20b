"""The DuoLM teacher started from the bundled all-MiniLM-L6-v2 (``--backend minilm``).

A BERT cross-encoder over the teacher's text prompts (:class:`TeacherPrompts`: the history's
titles, each candidate's full text), scored as multi-item scoring: a user's prefix is encoded
once and its keys and values are kept; every candidate is then encoded on its own, attending
to the prefix's keys and values and to itself (positions continuing the prefix's, segment 1),
so candidates never see each other and a candidate's score does not depend on the others. A
candidate's score is a linear read-out of the mean of its hidden states (MiniLM's sentence
pooling). All weights train; only the read-out starts from scratch.

The checkpoint is a BERT checkpoint (``config.json``, ``model.safetensors``: ``bert.*`` in
Hugging Face's names and ``score.*``) with the teacher's ``duolm.json`` beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from genrec.catalog.id_map import check_rows
from genrec.duolm.prompts import TeacherPrompts
from genrec.duolm.ranker import TeacherRanker, read_meta
from genrec.duolm.requests import Ranking, RankRequest, RowRankRequest, TableIds, rank_by_ids
from genrec.engine.inputs import InputError
from genrec.model.bert import BertEncoder, load_bert_weights, read_bert_config, save_bert

BACKEND = "minilm"


class CrossEncoder(nn.Module):
    """BERT encoder + a linear read-out of each candidate's mean hidden state."""

    def __init__(self, encoder: BertEncoder) -> None:
        super().__init__()
        self.bert = encoder
        self.score = nn.Linear(encoder.config.hidden_size, 1)

    @classmethod
    def from_sentence_encoder(cls, path: str | Path | None = None) -> CrossEncoder:
        """Start from a sentence encoder's BERT weights (default: the bundled MiniLM); the
        read-out starts at N(0, 0.02), bias 0. Attention dropout is off (hidden dropout
        stays): on the CPU it forces the unfused attention path, 2.6x the step time."""
        from genrec.catalog.embeddings import bundled_model_path

        path = Path(path) if path is not None else bundled_model_path()
        config = dataclasses.replace(read_bert_config(path), attention_probs_dropout_prob=0.0)
        model = cls(BertEncoder(config))
        load_bert_weights(model.bert, path, allow_unused=True)
        nn.init.normal_(model.score.weight, std=0.02)
        nn.init.zeros_(model.score.bias)
        return model

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> CrossEncoder:
        """A saved cross-encoder, loaded strictly."""
        model = cls(BertEncoder(read_bert_config(path)))
        model.load_weights(path)
        return model.to(device)

    def load_weights(self, path: str | Path) -> None:
        load_bert_weights(self, path)

    def save_pretrained(self, path: str | Path) -> None:
        save_bert(self, self.bert.config, path)

    def forward(self, prefixes: Sequence[list[int]], candidates: Sequence[Sequence[list[int]]],
                row_tokens: int = 256, rows_per_chunk: int = 64) -> list[torch.Tensor]:
        """Scores [n_candidates] of each user's candidates (token lists) after its prefix.

        Prefixes: one forward of [U, P], keeping every layer's keys and values. Candidates:
        each user's, concatenated into rows of up to ``row_tokens`` tokens (a candidate per row
        at least), forwards of up to ``rows_per_chunk`` rows [R, L]; a token attends to its
        user's prefix and to its own candidate only. Attention is computed over the whole row
        (the other candidates masked), so long rows waste it: 256 tokens (about 5 candidates
        of 49) took 0.55x the time of 1024-token rows for 100 candidates on the CPU.
        """
        dev = self.score.weight.device
        max_pos = self.bert.config.max_position_embeddings
        ids, valid = _pad(prefixes, dev)  # [U, P]
        u, p = ids.shape
        pos = torch.arange(p, device=dev).expand(u, p)
        _, kv = self.bert(ids, pos, torch.zeros_like(ids), valid[:, None, :].expand(u, p, p),
                          keep_kv=True)
        plen = valid.sum(1).tolist()
        rows = _rows(candidates, plen, row_tokens)
        if max(x for r in rows for x in r.positions) >= max_pos:
            raise InputError(f"a prefix and candidate exceed the encoder's {max_pos} positions")
        lengths = torch.tensor([len(c) for cs in candidates for c in cs], device=dev)
        total = torch.zeros(len(lengths), device=dev)  # each candidate's summed token scores
        for s in range(0, len(rows), rows_per_chunk):
            chunk = rows[s : s + rows_per_chunk]
            own = torch.tensor([r.user for r in chunk], device=dev)
            c_ids, c_valid = _pad([r.tokens for r in chunk], dev)  # [R, L]
            n = c_ids.shape[1]
            c_pos, _ = _pad([r.positions for r in chunk], dev)
            slot = torch.tensor([r.slots + [-1] * (n - len(r.slots)) for r in chunk], device=dev)
            mask = torch.cat([valid[own, None, :].expand(-1, n, p),
                              slot[:, :, None] == slot[:, None, :]], -1)  # [R, L, P + L]
            h, _ = self.bert(c_ids, c_pos, torch.ones_like(c_ids), mask,
                             context=[(k[own], v[own]) for k, v in kv])
            # the read-out is affine: the mean of token scores = the score of the mean state
            total = total.index_add(0, slot[c_valid], self.score(h)[..., 0][c_valid])
        return list((total / lengths).split([len(cs) for cs in candidates]))


@dataclass
class _Row:
    """One row of candidates of one user: tokens, positions, and each token's candidate slot
    (its index among all candidates of the call)."""

    user: int
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)


def _rows(candidates: Sequence[Sequence[list[int]]], plen: list[int], row_tokens: int
          ) -> list[_Row]:
    rows, slot = [], 0
    for u, cands in enumerate(candidates):
        row = _Row(u)
        for cand in cands:
            if not cand:
                raise InputError("an empty candidate")
            if row.tokens and len(row.tokens) + len(cand) > row_tokens:
                rows.append(row)
                row = _Row(u)
            row.tokens += cand
            row.positions += range(plen[u], plen[u] + len(cand))
            row.slots += [slot] * len(cand)
            slot += 1
        if row.tokens:
            rows.append(row)
    return rows


def _pad(rows: Sequence[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists -> values [N, max_len] (0-padded) and valid [N, max_len] (bool)."""
    n = max(len(r) for r in rows)
    ids = torch.tensor([list(r) + [0] * (n - len(r)) for r in rows], device=device)
    valid = torch.tensor([[True] * len(r) + [False] * (n - len(r)) for r in rows], device=device)
    return ids, valid


def encoder_prompts(prompts: TeacherPrompts, requests: Sequence[RowRankRequest]
                    ) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The cross-encoder's prefixes and candidates (each candidate's full text + [SEP]),
    after checking every row; ``InputError`` names the field."""
    prefixes, candidates = [], []
    n = prompts.num_items
    for r, req in enumerate(requests):
        where = f"requests[{r}]"
        if not len(req.candidates):
            raise InputError(f"{where}.candidates: empty candidate list")
        if req.user_vector is not None:
            raise InputError(f"{where}.user_vector: the MiniLM teacher takes no soft token")
        check_rows(req.history, n, f"{where}.history", InputError)
        check_rows(req.candidates, n, f"{where}.candidates", InputError)
        prefixes.append(prompts.prefix(req.history))
        candidates.append([prompts.texts[c] + [prompts.sep_id] for c in req.candidates])
    return prefixes, candidates


class CrossEncoderRanker:
    """The MiniLM teacher behind the same interface as :class:`TeacherRanker`."""

    def __init__(self, model: CrossEncoder, prompts: TeacherPrompts,
                 item_ids: Sequence[str] | None = None) -> None:
        self.model = model.eval()
        self.prompts = prompts
        self._catalog = TableIds.of_catalog(item_ids, prompts.num_items)

    def rank(self, requests: Sequence[RankRequest]) -> list[Ranking]:
        """As :meth:`TeacherRanker.rank`: the candidates (ids) best first."""
        return rank_by_ids(requests, self._catalog.ids, self.rank_rows)

    def rank_rows(self, requests: Sequence[RowRankRequest]) -> list[torch.Tensor]:
        """Scores [n_candidates] per request, in candidate order."""
        if not requests:
            raise InputError("requests: empty request list")
        prefixes, candidates = encoder_prompts(self.prompts, requests)
        self.model.eval()
        with torch.inference_mode():
            return [s.float() for s in self.model(prefixes, candidates)]


def load_teacher(
    path: str | Path, item_text: Mapping[int, Mapping[str, str]], num_items: int,
    device: str = "cpu", item_ids: Sequence[str] | None = None,
) -> TeacherRanker | CrossEncoderRanker:
    """A teacher checkpoint of either backend (``duolm.json``'s ``backend``: ``decoder``, the
    default, or ``minilm``)."""
    meta = read_meta(path)
    if meta.get("backend", "decoder") != BACKEND:
        return TeacherRanker.from_pretrained(path, item_text, num_items, device=device,
                                             item_ids=item_ids)
    if meta.get("kind") != "teacher":
        raise ValueError(f"{path}: a {meta.get('kind')} checkpoint, not a DuoLM teacher")
    prompts = TeacherPrompts.from_items(
        item_text, num_items, max_title_tokens=int(meta["max_title_tokens"]),
        max_text_tokens=int(meta["max_text_tokens"]), max_history=int(meta["max_history"]))
    return CrossEncoderRanker(CrossEncoder.load(path, device), prompts, item_ids)
