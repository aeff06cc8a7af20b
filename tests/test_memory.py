"""The engine's memory budget: taken at start from the free memory (RAM on the CPU), or given;
bad settings refused by name; logged once."""

from __future__ import annotations

import logging

import pytest
import torch

from genrec import Engine, EngineConfig
from genrec.engine.memory import SEARCH_BUFFER_SHARE, MemoryBudget, free_memory, take_budget
from genrec.model import ModelConfig, build_model


def test_cpu_budget_is_a_share_of_available_ram() -> None:
    free, source = free_memory(torch.device("cpu"))
    assert free > 0 and source
    budget = take_budget(torch.device("cpu"), 0.5)
    assert budget.fraction == 0.5 and budget.source == source
    # the free memory moves between the two reads: the share, not the exact bytes
    assert budget.total == int(budget.free * 0.5) and 0.25 * free < budget.total < free
    assert budget.search_buffers == int(budget.total * SEARCH_BUFFER_SHARE)


def test_given_budget_and_bad_settings() -> None:
    assert take_budget(torch.device("cpu"), 0.9, given=1 << 20) == MemoryBudget(
        1 << 20, 1 << 20, 1.0, "given")
    for fraction in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="memory_fraction"):
            take_budget(torch.device("cpu"), fraction)
    for given in (0, -5, True):
        with pytest.raises(ValueError, match="memory_budget_bytes"):
            take_budget(torch.device("cpu"), 0.8, given=given)


def test_engine_takes_and_logs_its_budget(caplog: pytest.LogCaptureFixture) -> None:
    cfg = ModelConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                      max_position_embeddings=32)
    with caplog.at_level(logging.INFO, logger="genrec.engine.memory"):
        engine = Engine(build_model(cfg), config=EngineConfig(memory_budget_bytes=3 << 30))
    assert engine.memory.total == 3 << 30
    assert engine.searches.config.max_bytes == engine.memory.search_buffers
    [line] = [r.getMessage() for r in caplog.records if "memory budget" in r.getMessage()]
    assert "3.00 GiB" in line and "1.50 GiB" in line
