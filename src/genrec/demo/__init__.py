"""The main job: a synthetic recommendation dataset, a tiny decoder trained on it from scratch,
and the engine scoring with it (``genrec demo``)."""

from genrec.demo.main_job import DemoResult, default_out_dir, run_demo
from genrec.demo.synthetic import SyntheticConfig, SyntheticData, generate
from genrec.demo.train import TrainConfig, tiny_config, train_model

__all__ = [
    "DemoResult", "SyntheticConfig", "SyntheticData", "TrainConfig", "default_out_dir",
    "generate", "run_demo", "tiny_config", "train_model",
]
