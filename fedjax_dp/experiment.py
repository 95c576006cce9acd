"""``Experiment``: the one obvious way to run fedjax_dp from Python.

    import fedjax_dp
    summary = fedjax_dp.Experiment("dp_fedavg_mnist", {"rounds": 20}).run("results/dp")
    print(summary.format(), summary.epsilon)

The config is a shipped config's name, a config file's path, or a ``ConfigDict`` (start from
``fedjax_dp.default_config()``); it is copied, locked (a misspelt key raises, naming the closest
one) and validated when the ``Experiment`` is made, before any data is loaded. Client sampling and
privacy accounting both come from ``config.sampling``, so they cannot disagree.

Your own model and data (``docs/your_model_and_data.md``) are registered by name
(``fedjax_dp.register_model``, ``fedjax_dp.register_data``) and named in the config, or given here
(``model=``, ``data=``), which registers them and sets ``model.name`` / ``data.source``:

    summary = fedjax_dp.Experiment("fedavg_mnist", {"rounds": 5}, model=CNN, data=clients).run()
"""

from __future__ import annotations

import copy
import os

import ml_collections

from fedjax_dp import configs
from fedjax_dp.core import hosts
from fedjax_dp.core.host_devices import use_a_device_per_core
from fedjax_dp.data.sources import register_data
from fedjax_dp.models import register_model
from fedjax_dp.plugins import load_entry_points
from fedjax_dp.training import plots, results
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.fit_to_data import adopt_source_clients
from fedjax_dp.training.loop import run_experiment
from fedjax_dp.training.quiet import LOG_FILE, quiet_console
from fedjax_dp.training.reporting import RunSummary
from fedjax_dp.training.run_batch import run_batched
from fedjax_dp.training.seeds import SeedsSummary, curves, summarize
from fedjax_dp.training.tensorboard import require_tensorboardx

__all__ = ["Experiment", "RunSummary", "SeedsSummary"]


class Experiment:
    """A validated configuration, ready to run once or over several seeds.

    Two rounds of the shipped DP-FedAvg config (embedded MNIST, Poisson sampling, PLD) with its
    noise calibrated so that those rounds spend epsilon 2; a misspelt key is refused before any data
    is loaded:

    >>> import tempfile
    >>> experiment = Experiment("dp_fedavg_mnist", {"rounds": 2, "privacy.target_epsilon": 2.0})
    >>> summary = experiment.run(tempfile.mkdtemp(), overwrite=True, progress=False)
    >>> summary.rounds, summary.formal, round(summary.epsilon, 2)
    (2, True, 2.0)
    >>> Experiment("dp_fedavg_mnist", {"dp.noise_multipler": 1.0})
    Traceback (most recent call last):
    KeyError: ...noise_multiplier...
    """

    def __init__(
        self,
        config: str | ml_collections.ConfigDict = configs.DEFAULT,
        overrides: dict | None = None,
        *,
        model=None,
        data=None,
    ):
        """``overrides``: dotted keys to values, e.g. ``{"dp.noise_multiplier": 1.2, "rounds":
        50}``. ``model``: your model (what ``register_model`` takes), registered and named as
        ``model.name``; ``data``: your federated data (what ``register_data`` takes), registered
        and named as ``data.source``. Loads the ``fedjax_dp.plugins`` entry points
        (``fedjax_dp.plugins``) and asks JAX for one CPU device per core first
        (``core.host_devices``: a no-op once JAX has started)."""
        use_a_device_per_core()
        load_entry_points()
        overrides = dict(overrides or {})
        for key, given, register in (
            ("model.name", model, register_model),
            ("data.source", data, register_data),
        ):
            if given is None:
                continue
            if key in overrides:
                raise ValueError(
                    f"Experiment: {key}={overrides[key]!r} and {key.split('.')[0]}= both given;"
                    " give one"
                )
            overrides[key] = register(None, given)
        if isinstance(config, str):
            cfg = configs.get(config, overrides)
        else:
            cfg = copy.deepcopy(config)
            cfg.lock()
            for key, value in (overrides or {}).items():
                configs.set_value(cfg, key, value)
        adopt_source_clients(cfg, overridden=tuple(overrides))
        validate_config(cfg, overridden=tuple(overrides))
        self.config = cfg

    def run(
        self,
        workdir: str | None = None,
        *,
        overwrite: bool = False,
        progress: bool | str = True,
        resume: bool = False,
        tensorboard: bool = False,
        verbose: bool = False,
        callbacks=(),
        distributed: bool = False,
    ) -> RunSummary:
        """Trains, evaluates and writes ``workdir`` (default ``results/<algorithm>``); returns the
        summary (``.final`` metrics, ``.epsilon`` and ``.formal`` where privacy is tracked,
        ``.format()``). ``callbacks``: your own ``training.callbacks.Callback``s (log each round's
        row elsewhere, ``StopWhen``). ``distributed``: this process is one of several running the
        same program (``fedjax_dp.distributed``: joins them first, before JAX starts; only process 0
        writes ``workdir``; every process gets the summary)."""
        if distributed:
            from fedjax_dp import distributed as joining

            joining.initialize()
        if tensorboard:
            require_tensorboardx()
        workdir = workdir or os.path.join("results", self.config.algorithm)
        # the libraries' detail into the workdir's log file (process 0 writes the workdir), the
        # console keeps our one line
        log_file = os.path.join(workdir, LOG_FILE) if hosts.is_primary() else None
        with quiet_console(verbose, log_file):
            return run_experiment(
                self.config,
                workdir,
                overwrite=overwrite,
                progress=progress,
                resume=resume,
                tensorboard=tensorboard,
                callbacks=callbacks,
            )

    def run_seeds(
        self, seeds, workdir: str | None = None, vectorized: bool = False, **options
    ) -> SeedsSummary:
        """One run per seed in ``<workdir>/seed_<s>``; writes ``seeds_summary.json`` (mean and 95 %
        t-interval of each final metric, best accuracy and epsilon) and ``seeds.png``.
        ``vectorized``: the seeds train in lockstep as one vmapped program
        (``training.run_batch``: each run's numbers up to float32 rounding, one compilation; one
        after another where the config cannot be batched); ``options`` then take ``overwrite``,
        ``progress`` (ignored) and ``verbose``."""
        seeds = [int(s) for s in seeds]
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
        workdir = workdir or os.path.join("results", f"{self.config.algorithm}-seeds")
        workdirs = [os.path.join(workdir, f"seed_{seed}") for seed in seeds]
        per_seed = [self._with_seed(seed) for seed in seeds]
        if vectorized:
            summaries = self._run_together(per_seed, workdirs, **options)
        else:
            summaries = []
            for one, one_workdir in zip(per_seed, workdirs):
                summaries.append(Experiment(one).run(one_workdir, **options))
                if summaries[-1].interrupted:  # SIGINT / SIGTERM stops the seeds still to run
                    break
        if len(summaries) < len(seeds):
            seeds, workdirs = seeds[: len(summaries)], workdirs[: len(summaries)]
        summary = summarize(workdir, seeds, summaries, workdirs)
        with open(os.path.join(workdir, "seeds_summary.json"), "w") as f:
            f.write(results.dumps({**vars(summary), "rounds_min": summary.rounds_min}, indent=2))
        plots.plot_seeds(
            curves([results.read_metrics(w) for w in workdirs]),
            os.path.join(workdir, "seeds.png"),
            f"{self.config.algorithm}, seeds {','.join(map(str, seeds))}: mean and 95 % interval",
            seeds=len(seeds),
        )
        return summary

    def _with_seed(self, seed: int):
        one = copy.deepcopy(self.config)
        one.seed = seed
        return one

    def _run_together(self, per_seed, workdirs, **options) -> list:
        return run_together(per_seed, workdirs, "run_seeds", **options)


def run_together(configs, workdirs, caller: str, extra_callbacks=None, **options) -> list:
    """The runs of ``configs`` in lockstep as one vmapped program (``training.run_batch``), for
    ``caller``'s ``vectorized=True``; ``options``: ``Experiment.run``'s, of which ``overwrite`` and
    ``verbose`` apply (``progress`` is ignored) and the others are refused."""
    unsupported = [
        k for k in ("resume", "tensorboard", "callbacks", "distributed") if options.get(k)
    ]
    if unsupported:
        raise ValueError(
            f"{caller}(vectorized=True) with {unsupported[0]}={options[unsupported[0]]!r}: not"
            " supported together; run one after another"
        )
    with quiet_console(options.get("verbose", False), None):
        return run_batched(configs, workdirs, options.get("overwrite", False), extra_callbacks)
