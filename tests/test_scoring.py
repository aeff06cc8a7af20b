"""read_scores: each mode reads the right rows of the hidden states."""

from __future__ import annotations

import torch

from genrec.engine.batch import RequestLimits, pack_requests
from genrec.engine.params import ScoreParams
from genrec.engine.scoring import read_scores
from genrec.model import ModelConfig, build_model

LIMITS = RequestLimits(vocab_size=12, max_positions=64, item_rows=0, user_dim=0, soft_token_id=None)


def _model():
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=12, hidden_size=8, intermediate_size=8,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=4, score_head=True))


def test_modes_read_expected_rows() -> None:
    model = _model()
    batch = pack_requests([[1, 2]], [[[3, 4, 5], [6]]], [None], LIMITS)
    hidden = torch.randn(batch.layout.num_tokens, 8)  # any hidden states will do
    logp = torch.log_softmax(model.logits(hidden), -1)
    with torch.no_grad():
        labels = read_scores(model, hidden, batch, ScoreParams("labels", [0, 9]))
        loglik = read_scores(model, hidden, batch, ScoreParams("loglik"))
        head = read_scores(model, hidden, batch, ScoreParams("head"))
    # candidate 0 occupies rows 2..4, candidate 1 row 5; the prefix ends at row 1
    assert torch.allclose(labels[0], logp[4, [0, 9]]) and torch.allclose(labels[1], logp[5, [0, 9]])
    assert torch.allclose(loglik[0], logp[1, 3] + logp[2, 4] + logp[3, 5])
    assert torch.allclose(loglik[1], logp[1, 6])
    assert torch.allclose(head, model.score_head(hidden[[4, 5]])[:, 0])
