"""Datasets: loaders for interaction data and the leave-one-out split."""

from genrec.data.columns import TableColumns
from genrec.data.loaders import (
    Dataset,
    JsonDatasetFiles,
    find_json_dataset,
    load_json_dataset,
    load_table_dataset,
)
from genrec.data.split import Example, LeaveOneOutSplit, leave_one_out

__all__ = [
    "Dataset",
    "Example",
    "JsonDatasetFiles",
    "LeaveOneOutSplit",
    "TableColumns",
    "find_json_dataset",
    "leave_one_out",
    "load_json_dataset",
    "load_table_dataset",
]
