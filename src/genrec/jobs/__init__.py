"""Offline jobs over a whole dataset: recommendations for every user (``genrec recommend``)."""

from genrec.jobs.recommend import BatchParams, recommend_users, write_recommendations

__all__ = ["BatchParams", "recommend_users", "write_recommendations"]
