"""Runs an experiment config; the same as the ``fedjax-dp`` console command."""

from fedjax_dp.cli import main

if __name__ == "__main__":
    main()
