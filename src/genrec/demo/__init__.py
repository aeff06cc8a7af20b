"""The main job (``genrec demo``): synthetic data with natural Semantic IDs, a tiny
generative-retrieval model trained from scratch, its quality against popularity, and genrec's
HTTP server answering a real ``/v1/recommend`` request."""

from genrec.demo.main_job import DemoResult, default_out_dir, run_demo
from genrec.demo.quality import Quality
from genrec.demo.synthetic import SyntheticConfig, SyntheticData, generate, semantic_index
from genrec.demo.train import TrainConfig, tiny_config, train_model

__all__ = [
    "DemoResult", "Quality", "SyntheticConfig", "SyntheticData", "TrainConfig",
    "default_out_dir", "generate", "run_demo", "semantic_index", "tiny_config", "train_model",
]
