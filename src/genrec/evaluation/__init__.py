"""Evaluation: ranking metrics and full-catalog evaluation of generative recommenders."""

from genrec.evaluation.full_catalog import evaluate_generative, evaluate_split, split_examples
from genrec.evaluation.topk_metrics import ndcg_at_k, ranking_metrics, recall_at_k, target_ranks

__all__ = [
    "evaluate_generative", "evaluate_split", "ndcg_at_k", "ranking_metrics", "recall_at_k",
    "split_examples", "target_ranks",
]
