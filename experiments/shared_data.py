"""The experiments read this project's shared data folder (``../shared/data`` beside the repository)
through ``FEDJAX_DP_DATA``, which the library's configs read
(``fedjax_dp.data.local_files.default_data_dir``); a value the user set is kept. Imported for its
effect by the scripts that run shipped configs."""

import os

SHARED_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
if os.path.isdir(SHARED_DATA):
    os.environ.setdefault("FEDJAX_DP_DATA", os.path.abspath(SHARED_DATA))
