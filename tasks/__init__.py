"""Datasets, client partitions, models, the run configuration and compute settings of the federated
image-classification tasks. Import the submodules themselves: importing this package must stay cheap
(no torch), because the command-line tools import tasks.config and tasks.runlog before they know
whether they need torch at all."""

if __name__ != "fedbayes.tasks":  # fedbayes/tasks is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.tasks, not {__name__}")
