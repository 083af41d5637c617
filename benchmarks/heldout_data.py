"""Real tabular data sets nobody tuned on, for checking the defaults (issue 65, item 4): six of the UCI sets that R's
mlbench package ships, read from Debian's r-cran-mlbench without installing R.

    apt-get download r-cran-mlbench && dpkg -x r-cran-mlbench_*.deb /opt/mlbench
    pip install -e ".[dev,benchmarks]"      # rdata, which parses R's .rda files

MLBENCH_DIR names the folder of the package's .rda files (default: where `dpkg -x` above puts them, else R's site
library where `apt-get install r-cran-mlbench` puts them). `rdata` parses R's serialisation format into data frames;
it runs nothing the file names.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch

FOLDERS = (
    Path("/opt/mlbench/usr/lib/R/site-library/mlbench/data"),
    Path("/usr/lib/R/site-library/mlbench/data"),
)
# name -> (mlbench's data set, its class column): 208 to 6,435 examples, 2 to 6 classes, 8 to 60 features
SETS = {
    "sonar": ("Sonar", "Class"),
    "ionosphere": ("Ionosphere", "Class"),
    "glass": ("Glass", "Type"),
    "vehicle": ("Vehicle", "Class"),
    "pima": ("PimaIndiansDiabetes", "diabetes"),
    "satellite": ("Satellite", "classes"),
}


def mlbench_folder() -> Path:
    """The folder of mlbench's .rda files: MLBENCH_DIR, else the first of FOLDERS that exists.

    Returns:
        The folder.

    Raises:
        FileNotFoundError: none exists, saying how to get them.
    """
    candidates = [Path(os.environ["MLBENCH_DIR"])] if os.environ.get("MLBENCH_DIR") else list(FOLDERS)
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise FileNotFoundError(
        f"no mlbench data in {', '.join(map(str, candidates))}: run `apt-get download r-cran-mlbench && dpkg -x "
        "r-cran-mlbench_*.deb /opt/mlbench`, or set MLBENCH_DIR to the folder of its .rda files"
    )


def load(name: str) -> Bunch:
    """One of SETS as scikit-learn's loaders give theirs: every feature a float (a factor as its level's index), the
    class as its level's index.

    Args:
        name: a key of SETS.

    Returns:
        Bunch(data: float64 [n, d], target: int64 [n]).

    Raises:
        FileNotFoundError: the .rda file is missing (`mlbench_folder`).
        ModuleNotFoundError: rdata is not installed.
    """
    import rdata

    data_set, label = SETS[name]
    with warnings.catch_warnings():  # mlbench's files declare no string encoding; their strings are ASCII
        warnings.simplefilter("ignore", UserWarning)
        frame = rdata.read_rda(mlbench_folder() / f"{data_set}.rda")[data_set]
    features = frame.drop(columns=[label])
    columns = [
        features[column].cat.codes if features[column].dtype == "category" else features[column]
        for column in features.columns
    ]
    return Bunch(
        data=np.column_stack(columns).astype(np.float64),
        target=frame[label].cat.codes.to_numpy().astype(np.int64),
    )


def loaders() -> dict[str, Callable[[], Bunch]]:
    """Each of SETS's loaders, for benchmarks/user_defaults.py's `write_dataset`.

    Returns:
        name -> a function of no arguments returning its Bunch.
    """
    return {name: (lambda name=name: load(name)) for name in SETS}
