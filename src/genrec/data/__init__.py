"""Datasets: loaders for interaction data and the leave-one-out split."""

from genrec.data.columns import TableColumns
from genrec.data.dataset import Dataset
from genrec.data.json_dataset import JsonDatasetFiles, find_json_dataset, load_json_dataset
from genrec.data.split import Example, LeaveOneOutSplit, leave_one_out
from genrec.data.table_dataset import load_table_dataset

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
