"""Download the official datasets and build their corpora and indexes: ``capo data prepare NAME``."""

from .datasets import DATASETS, dataset_info, is_prepared, prepare, verify

__all__ = ["DATASETS", "dataset_info", "is_prepared", "prepare", "verify"]
