"""Finding a dataset's files in a configured data directory, with an error that says what is
missing, where it was looked for, and how to get it."""

from __future__ import annotations

import os

DATA_ENV = "FEDJAX_DP_DATA"
HOW_TO_GET = (
    f"set {DATA_ENV} to the folder that holds one folder per dataset (mnist/, cifar10/, cifar100/,"
    " femnist/, shakespeare/), or data.data_dir to the dataset's own folder; or use the TFDS"
    " source (source='tfds:<name>', data.download=True) on a machine with internet"
)


def find_file(data_dir: str, names: tuple[str, ...], dataset: str) -> str:
    """Returns the first of ``names`` that exists in ``data_dir``; raises ``FileNotFoundError``."""
    if not data_dir:
        raise FileNotFoundError(f"{dataset}: data.data_dir is empty; {HOW_TO_GET}")
    for name in names:
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    variable = os.environ.get(DATA_ENV)
    also = f"also tried {list(names[1:])}; " if len(names) > 1 else ""
    raise FileNotFoundError(
        f"{dataset} file {names[0]} not found in {os.path.abspath(data_dir)!r} ({also}{DATA_ENV} is"
        f" {repr(variable) if variable else 'not set'}); {HOW_TO_GET}"
    )


def default_data_dir(dataset: str) -> str:
    """The data directory configs use by default: ``$FEDJAX_DP_DATA/<dataset>``, else the per-user
    ``~/.cache/fedjax_dp/data/<dataset>`` (the library knows no repository's layout: the tests and
    the experiments set the variable)."""
    root = os.environ.get(DATA_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "fedjax_dp", "data"
    )
    return os.path.join(root, dataset)


def open_hdf5(path: str, needed_by: str):
    """``h5py.File(path, "r")``; h5py is an optional dependency (the ``shakespeare`` extra), so its
    absence is an error naming what needs it and how to install it."""
    try:
        import h5py
    except ImportError as error:
        raise ValueError(
            f'{needed_by} reads HDF5 files: pip install "fedjax_dp[shakespeare]" (or pip install'
            " h5py)"
        ) from error
    return h5py.File(path, "r")
