"""Runs an experiment config; the same as the ``fedjax-dp`` console command."""

import shared_data  # noqa: F401  (FEDJAX_DP_DATA: the shipped configs' data folder)
from fedjax_dp.cli import main

if __name__ == "__main__":
    main()
