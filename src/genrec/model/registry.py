"""Architecture registry: maps a checkpoint's ``architectures[0]`` to a model class.

Out-of-tree models register themselves without editing genrec::

    from genrec.model import register_architecture
    register_architecture("MyForCausalLM", MyModel)  # MyModel(config: ModelConfig)

A registered class must accept a :class:`ModelConfig` and provide the ``DecoderLM`` interface
(``forward(embeds, positions, layout, cache)``, ``logits``, ``label_logits``, ...).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from genrec.model.config import ModelConfig

_REGISTRY: dict[str, Callable[[ModelConfig], nn.Module]] = {}


def register_architecture(name: str, builder: Callable[[ModelConfig], nn.Module]) -> None:
    """Register ``builder`` for checkpoints whose config names architecture ``name``."""
    if not name or not callable(builder):
        raise ValueError("register_architecture needs a name and a callable")
    _REGISTRY[name] = builder


def build_model(config: ModelConfig) -> nn.Module:
    """Instantiate the registered architecture of ``config``."""
    if config.architecture not in _REGISTRY:
        raise ValueError(
            f"unknown architecture {config.architecture!r}; registered: {sorted(_REGISTRY)}"
        )
    return _REGISTRY[config.architecture](config)


def registered_architectures() -> list[str]:
    return sorted(_REGISTRY)
