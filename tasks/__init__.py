"""Datasets, client partitions and models for the federated image-classification tasks."""

from tasks.datasets import DATASETS, DEBIAN_FMNIST_DIR, Dataset, DatasetNotFoundError, load_dataset
from tasks.models import ACTIVATIONS, MODELS, build_model, parse_hidden
from tasks.partitions import (
    SPLITS,
    DirichletSplit,
    describe_partitions,
    partition_dataset,
    split_dirichlet,
    split_iid,
    split_two_class,
    training_subset,
)

__all__ = [
    "ACTIVATIONS",
    "DATASETS",
    "DEBIAN_FMNIST_DIR",
    "MODELS",
    "SPLITS",
    "Dataset",
    "DatasetNotFoundError",
    "DirichletSplit",
    "build_model",
    "describe_partitions",
    "load_dataset",
    "parse_hidden",
    "partition_dataset",
    "split_dirichlet",
    "split_iid",
    "split_two_class",
    "training_subset",
]
