"""A scripted generative task and a tiny model for the training-loop tests."""

from __future__ import annotations

import torch

from genrec.catalog.semantic_ids import with_dedup_level
from genrec.model import build_model
from genrec.training.generative_task import GenerativeTask, scratch_config
from genrec.training.initialization import init_weights
from genrec.training.loop import LoopConfig
from genrec.vocab.sid_vocab import SidVocab

N_ITEMS = 30


class ScriptedTask(GenerativeTask):
    """Generative data with validation metrics read from a script (one value per epoch)."""

    def __init__(self, script: list[float | None] | None = None, user_vectors=None) -> None:
        g = torch.Generator().manual_seed(0)
        vocab = SidVocab(with_dedup_level(torch.randint(0, 6, (N_ITEMS, 2), generator=g),
                                          [6, 6]), max_history=4)
        seqs = [torch.randint(0, N_ITEMS, (6,), generator=g).tolist() for _ in range(16)]
        super().__init__(vocab, seqs, user_vectors, batch_tokens=120, progress=False)
        self.script, self.calls = script, 0

    def validate(self, model):
        if self.script is None:
            return None
        self.calls += 1
        value = self.script[self.calls - 1]
        if value is None:
            raise KeyboardInterrupt  # a run killed before this epoch's checkpoint
        return {"ndcg@10": value}


def model_for(task: GenerativeTask, seed: int = 0, user_dim: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(scratch_config(task.vocab, hidden=16, layers=1, heads=2, kv_heads=1,
                                       head_dim=8, user_dim=user_dim))
    init_weights(model)
    return model


def config(epochs: int, patience: int = 0) -> LoopConfig:
    return LoopConfig(epochs=epochs, lr=1e-2, patience=patience, progress=False)
