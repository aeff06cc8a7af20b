"""Multi-item scoring read-outs: label log-probs, summed log-likelihood, scalar head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genrec.catalog.item_table import ItemTable
from genrec.engine.batch import PackedBatch
from genrec.engine.inputs import InputError
from genrec.engine.params import ScoreParams
from genrec.model.decoder import DecoderLM
from genrec.utils.device import to_device
from genrec.utils.sync_trap import host_side


def read_scores(
    model: DecoderLM, hidden: torch.Tensor, batch: PackedBatch, params: ScoreParams
) -> torch.Tensor:
    """Scores of every branch of ``batch`` from the final hidden states [T, hidden].

    Returns [NB, K] in 'labels' mode, [NB] otherwise (fp32, on the model's device).
    """
    device = hidden.device
    lens = torch.tensor(batch.branch_lens, dtype=torch.long)
    last = to_device(batch.branch_starts + lens - 1, device)
    if params.mode == "labels":
        labels = to_device(torch.tensor(params.label_token_ids, dtype=torch.long), device)
        h = hidden[last]
        picked = model.label_logits(h, labels)  # [NB, K]
        if params.apply_softmax:
            return torch.softmax(picked, dim=-1)
        return picked - model.log_normalizer(h)[:, None]
    if params.mode == "head":
        return model.score_head(hidden[last]).float()[:, 0]
    return _summed_loglik(model, hidden, batch)


def _summed_loglik(model: DecoderLM, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    # Token i of a branch is predicted by the row before it: the prefix's last row for i = 0,
    # the branch's own row i - 1 otherwise.
    device = hidden.device
    with host_side():  # indices and input checks on the batch's host tensors
        ids = batch.inputs.token_ids
        lens = torch.tensor(batch.branch_lens, dtype=torch.long)
        n_br = lens.numel()
        branch_of = torch.repeat_interleave(torch.arange(n_br), lens)  # [Tb]
        j = torch.arange(int(lens.sum())) - (torch.cumsum(lens, 0) - lens)[branch_of]
        rows = batch.branch_starts[branch_of] + j
        request_of = torch.repeat_interleave(torch.arange(len(batch.branch_counts)),
                                             torch.tensor(batch.branch_counts))
        prefix_last = batch.prefix_last[request_of][branch_of]
        if bool((prefix_last < 0).any()):
            raise InputError(
                "'loglik' mode needs a non-empty prefix to predict a candidate's first token"
            )
        targets = ids[rows]
        if bool((targets < 0).any()) or bool((targets >= model.config.vocab_size).any()):
            raise InputError("'loglik' mode scores text tokens only: a candidate holds item "
                             "tokens or raw embeddings")
        predictors = to_device(torch.where(j == 0, prefix_last, rows - 1), device)
        targets, branch_of = to_device(targets, device), to_device(branch_of, device)
    logp = model.token_logprobs(hidden[predictors], targets)
    return torch.zeros(n_br, device=device).index_add_(0, branch_of, logp)


@dataclass
class PreparedScore:
    """Scoring requests checked and packed on the host (:meth:`Engine.prepare_score`)."""

    params: ScoreParams
    table: ItemTable | None
    batches: list[PackedBatch]
