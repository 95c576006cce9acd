"""Finding a dataset's files in a configured data directory, with an error that says what is
missing, where it was looked for, and how to get it."""

from __future__ import annotations

import os

HOW_TO_GET = ("point data.data_dir at the folder that holds them (on this project's machines: "
              "../shared/data/<dataset>), or use the TFDS source (source='tfds:<name>', data.download=True) "
              "on a machine with internet")


def find_file(data_dir: str, names: tuple[str, ...], dataset: str) -> str:
    """Returns the first of ``names`` that exists in ``data_dir``; raises ``FileNotFoundError``."""
    if not data_dir:
        raise FileNotFoundError(f"{dataset}: data.data_dir is empty; {HOW_TO_GET}")
    for name in names:
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(
        f"{dataset} file {names[0]} not found in {os.path.abspath(data_dir)!r} "
        f"(also tried {list(names[1:])}); {HOW_TO_GET}")


def default_data_dir(dataset: str) -> str:
    """The data directory configs use by default: ``$FEDJAX_DP_DATA/<dataset>``, else
    ``../shared/data/<dataset>`` (this project's machines), relative to where you run."""
    return os.path.join(os.environ.get("FEDJAX_DP_DATA", os.path.join("..", "shared", "data")), dataset)
