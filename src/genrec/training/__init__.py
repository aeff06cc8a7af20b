"""Training: generative-retrieval data and loss, user vectors, and a generic training loop."""

from genrec.data.split import training_sequences
from genrec.training.generative_loss import batch_loss
from genrec.training.generative_task import GenerativeTask
from genrec.training.loop import FitResult, LoopConfig, fit
from genrec.training.user_vectors import compute_user_vectors, svd_user_vectors
from genrec.training.windows import make_windows

__all__ = [
    "FitResult", "GenerativeTask", "LoopConfig", "batch_loss", "compute_user_vectors", "fit",
    "make_windows", "svd_user_vectors", "training_sequences",
]
