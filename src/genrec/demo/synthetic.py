"""A seeded synthetic recommendation dataset: topical clusters, users who mostly stay on topic.

Items ``0 .. num_items - 1`` fall into ``num_clusters`` contiguous clusters (item ``i`` belongs
to cluster ``i * num_clusters // num_items``). Within a cluster, items have Zipf-like
popularity. Each user has a preferred cluster (popular clusters are preferred more often); a
sequence starts there and, at each step, moves to a random cluster with probability
``drift_prob``, else stays. With probability ``follow_prob`` the next item is the successor of
the previous one in its cluster (a sequential pattern); otherwise it is drawn by popularity
among the current cluster's unseen items. A user never sees an item twice.

Items get natural Semantic IDs (:func:`semantic_index`): ``(cluster, rank inside the cluster)``;
the model's tokens are those of :class:`genrec.vocab.sid_vocab.SidVocab` over that index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from genrec.catalog.semantic_ids import SemanticIndex


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and behaviour of the synthetic dataset."""

    num_items: int = 200
    num_clusters: int = 10
    num_users: int = 5000
    min_len: int = 6
    max_len: int = 16
    drift_prob: float = 0.1
    follow_prob: float = 0.3
    zipf: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if self.num_clusters < 2 or self.num_items < 2 * self.num_clusters:
            raise ValueError("need at least 2 clusters and 2 items per cluster")
        if not 2 <= self.min_len <= self.max_len < self.num_items:
            raise ValueError("need 2 <= min_len <= max_len < num_items")
        if not (0 <= self.drift_prob <= 1 and 0 <= self.follow_prob <= 1):
            raise ValueError("drift_prob and follow_prob must lie in [0, 1]")


@dataclass
class SyntheticData:
    """The generated dataset: item clusters, user sequences (item ids), preferred clusters."""

    config: SyntheticConfig
    item_cluster: np.ndarray  # [num_items] cluster of each item
    sequences: list[list[int]]  # per user, item ids in time order
    preferred: np.ndarray  # [num_users] preferred cluster of each user

    def cluster_items(self, cluster: int) -> np.ndarray:
        """Item ids of ``cluster``."""
        return np.flatnonzero(self.item_cluster == cluster)


def generate(config: SyntheticConfig | None = None) -> SyntheticData:
    """Generate the dataset of ``config`` (deterministic for a given seed)."""
    cfg = config or SyntheticConfig()
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    item_cluster = np.arange(cfg.num_items) * cfg.num_clusters // cfg.num_items
    members = [np.flatnonzero(item_cluster == c) for c in range(cfg.num_clusters)]
    # Popularity inside each cluster: Zipf weights over a random order of its items.
    weight = np.zeros(cfg.num_items)
    for items in members:
        ranks = rng.permutation(len(items))
        weight[items] = 1.0 / (ranks + 1.0) ** cfg.zipf
    cluster_pref = 1.0 / np.sqrt(rng.permutation(cfg.num_clusters) + 1.0)
    cluster_pref /= cluster_pref.sum()
    preferred = rng.choice(cfg.num_clusters, size=cfg.num_users, p=cluster_pref)

    sequences = []
    for u in range(cfg.num_users):
        length = int(rng.integers(cfg.min_len, cfg.max_len + 1))
        sequences.append(_user_sequence(rng, cfg, int(preferred[u]), length, members, weight,
                                        item_cluster))
    return SyntheticData(config=cfg, item_cluster=item_cluster, sequences=sequences,
                         preferred=preferred)


def _user_sequence(
    rng: np.random.Generator, cfg: SyntheticConfig, cluster: int, length: int,
    members: list[np.ndarray], weight: np.ndarray, item_cluster: np.ndarray,
) -> list[int]:
    seen = np.zeros(cfg.num_items, dtype=bool)
    seq: list[int] = []
    for step in range(length):
        if step and rng.random() < cfg.drift_prob:
            cluster = int(rng.integers(cfg.num_clusters))
        item = -1
        if seq and rng.random() < cfg.follow_prob and item_cluster[seq[-1]] == cluster:
            items = members[cluster]
            nxt = items[(np.searchsorted(items, seq[-1]) + 1) % len(items)]
            item = -1 if seen[nxt] else int(nxt)
        if item < 0:
            pool = members[cluster][~seen[members[cluster]]]
            if pool.size == 0:  # the cluster is exhausted: any unseen item
                pool = np.flatnonzero(~seen)
            p = weight[pool] / weight[pool].sum()
            item = int(rng.choice(pool, p=p))
        seen[item] = True
        seq.append(item)
    return seq


def item_name(row: int) -> str:
    """The id the synthetic catalog gives the item in ``row``, as a real table would name it."""
    return f"song-{row:05d}"


def item_row(name: str) -> int:
    """The row of the synthetic item named ``name`` (:func:`item_name`)."""
    return int(name.removeprefix("song-"))


def semantic_index(data: SyntheticData) -> SemanticIndex:
    """The 2-level Semantic IDs of the items: level 0 = cluster, level 1 = rank inside it;
    the items named by :func:`item_name`.

    Clusters are contiguous, so an item's rank is its offset from the cluster's first item;
    the level-1 codebook is as large as the largest cluster.
    """
    clusters = torch.as_tensor(data.item_cluster, dtype=torch.int64)
    first = torch.searchsorted(clusters, clusters)  # first item of each item's cluster
    rank = torch.arange(clusters.numel()) - first
    index = SemanticIndex(
        torch.stack([clusters, rank], dim=1),
        [data.config.num_clusters, int(rank.max()) + 1],
        [item_name(i) for i in range(clusters.numel())],
        meta={"method": "synthetic clusters: (cluster, rank inside the cluster)"},
    )
    index.validate()
    return index


def split_users(
    data: SyntheticData, num_heldout: int, seed: int = 0
) -> tuple[list[int], list[int]]:
    """Random disjoint (train users, held-out users), each sorted."""
    n = len(data.sequences)
    if not 0 < num_heldout < n:
        raise ValueError(f"num_heldout must lie in 1..{n - 1}, got {num_heldout}")
    order = np.random.default_rng(seed).permutation(n)
    return sorted(order[num_heldout:].tolist()), sorted(order[:num_heldout].tolist())


def popularity(data: SyntheticData, users: list[int]) -> np.ndarray:
    """Interaction count of every item over ``users``' sequences: [num_items]."""
    counts = np.zeros(data.config.num_items, dtype=np.int64)
    for u in users:
        np.add.at(counts, data.sequences[u], 1)
    return counts

