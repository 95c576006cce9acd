"""The ``fedjax-dp`` command (also ``python3 -m fedjax_dp``): run a config, by name or by path, with
``ml_collections`` overrides, from any folder.

    fedjax-dp --config dp_fedavg_mnist --config.rounds=20 --workdir results/dp
    fedjax-dp --config my_config.py --seeds 0,1,2      # three seeds: mean and 95 % interval
    fedjax-dp --config dp_fedavg_mnist --sweep dp.clip_norm=0.5,1 --sweep server.learning_rate=0.5,1
                                                       # a sweep, its selection accounted
    fedjax-dp --help                                   # the options, the shipped configs, every key
    fedjax-dp configs                                  # the shipped configs only
    fedjax-dp --import my_module --config.model.name=my_cnn --config.data.source=my_clients
                                                       # your model and data, registered there

Exit status (one line on stderr says why for every status but 0):
  0    the run trained and wrote its results;
  1    it could not train a single round, could not write its results (a full or read-only disk),
       or a data file is damaged (or does not match the data folder's SHA256SUMS);
  2    an invalid command or config (naming the key and the closest valid one, before any data is
       loaded), a workdir held by another run, or an earlier run there without --overwrite /
       --resume;
  3    the training diverged and the run stopped (``training.divergence``; its results are written);
  130  interrupted (SIGINT / SIGTERM): it checkpointed and stopped; ``--resume`` continues it.

Compiled programs are kept in a persistent XLA cache (``training/compilation_cache.py``: folder
``FEDJAX_DP_COMPILATION_CACHE``, default ``~/.cache/fedjax_dp/xla``, ``off`` to disable), so a
second run of the same programs loads them instead of compiling.
"""

from __future__ import annotations

import math
import os
import re
import sys
import textwrap
import time
import traceback

from absl import flags
from ml_collections import config_flags

from fedjax_dp import configs
from fedjax_dp.core.host_devices import use_a_device_per_core
from fedjax_dp.training.compilation_cache import ENV, default_folder, use_persistent_cache
from fedjax_dp.training.config_docs import KEY_DOCS, describe_keys

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    configs.path(configs.DEFAULT),
    "A shipped config's name or a config file's path.",
    flag_values=FLAGS,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Results directory (default: results/<algorithm>-<time>).", flag_values=FLAGS
)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace the results of an earlier run in --workdir.", flag_values=FLAGS
)
_RESUME = flags.DEFINE_bool(
    "resume", False, "Continue the run in --workdir from its newest checkpoint.", flag_values=FLAGS
)
_SEEDS = flags.DEFINE_string(
    "seeds",
    "",
    "Comma-separated seeds (e.g. 0,1,2): one run per seed under "
    "<workdir>/seed_<s>, then the mean and 95 % interval (seeds_summary.json, seeds.png).",
    flag_values=FLAGS,
)
_VECTORIZE = flags.DEFINE_bool(
    "vectorize",
    False,
    "With --seeds or --sweep: the runs train in lockstep as one vmapped program, compiled once"
    " (each run's numbers up to float32 rounding; one after another where the config cannot be"
    " batched; a --sweep over keys other than the seed, learning rates, dp.clip_norm,"
    " dp.noise_multiplier and privacy.target_epsilon is refused: docs/sweeps.md)",
    flag_values=FLAGS,
)
_SWEEP = flags.DEFINE_multi_string(
    "sweep",
    [],
    "KEY=V1,V2,...: sweep a config key over these values (repeat for a grid); each run under"
    " <workdir>/run_<i>, the best by --sweep_metric, its selection's privacy cost accounted"
    " (sweep_summary.json, sweep.png; docs/sweeps.md)",
    flag_values=FLAGS,
)
_SWEEP_RUNS = flags.DEFINE_string(
    "sweep_runs",
    "poisson",
    "How many runs a --sweep makes: poisson (a Poisson number, mean --sweep_num_runs, each drawn"
    " from the grid: the best run costs RepeatAndSelect), negative_binomial (truncated, geometric),"
    " or fixed (each grid point once: accounted by composition).",
    flag_values=FLAGS,
)
_SWEEP_NUM_RUNS = flags.DEFINE_string(
    "sweep_num_runs",
    "",
    "The mean number of runs of a --sweep (default: the grid's size).",
    flag_values=FLAGS,
)
_SWEEP_BUDGET = flags.DEFINE_string(
    "sweep_budget",
    "",
    "An epsilon for the released (best) model: a --sweep that would spend more is refused before"
    " it starts.",
    flag_values=FLAGS,
)
_SWEEP_METRIC = flags.DEFINE_string(
    "sweep_metric",
    "test_accuracy",
    "The final metric that picks a --sweep's best run (server-held metrics cost no privacy;"
    " docs/sweeps.md).",
    flag_values=FLAGS,
)
_SWEEP_MODE = flags.DEFINE_string(
    "sweep_mode",
    "max",
    "max or min: whether the best run has the largest or the smallest --sweep_metric.",
    flag_values=FLAGS,
)
_SWEEP_SHAPE = flags.DEFINE_string(
    "sweep_shape",
    "",
    "With --sweep_runs negative_binomial: the truncated negative binomial's shape eta >= 0"
    " (1: geometric, the default; 0: logarithmic).",
    flag_values=FLAGS,
)
_TENSORBOARD = flags.DEFINE_bool(
    "tensorboard", False, "Also write TensorBoard scalars (needs tensorboardX).", flag_values=FLAGS
)
_IMPORT = flags.DEFINE_multi_string(
    "import",
    [],
    "A module (name or .py path) to import first, which registers your models and data sources"
    " (fedjax_dp.register_model / register_data)",
    flag_values=FLAGS,
)
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.", flag_values=FLAGS)
_VERBOSE = flags.DEFINE_bool(
    "verbose", False, "Show library logs (orbax, dp_accounting); -v for short.", flag_values=FLAGS
)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    False,
    "One run over several processes (jax.distributed): the "
    "cluster's auto-detection (TPU, SLURM, Open MPI) or the three options below; "
    "fedjax-dp-launch -n N starts N on this machine.",
    flag_values=FLAGS,
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (--distributed).", flag_values=FLAGS
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "How many processes (--distributed).", flag_values=FLAGS
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index (--distributed).", flag_values=FLAGS
)
_DISTRIBUTED_TIMEOUT = flags.DEFINE_integer(
    "distributed_timeout",
    None,
    "Seconds to connect, and before a lost process ends the others (default 60).",
    flag_values=FLAGS,
)

USAGE = """usage: fedjax-dp [--config NAME|PATH] [--config.KEY=VALUE ...] [--workdir DIR]
                 [--import MODULE ...] [--seeds 0,1,2] [--vectorize] [--overwrite] [--resume]
                 [--tensorboard]
                 [--sweep KEY=V1,V2 ... [--sweep_runs poisson|negative_binomial|fixed]
                  [--sweep_num_runs N] [--sweep_budget EPSILON] [--sweep_metric M]
                  [--sweep_mode max|min] [--sweep_shape ETA]]
                 [--noprogress] [-v]
                 [--distributed [--coordinator_address H:P --num_processes N --process_id I]]
       fedjax-dp configs          list the shipped configs
       fedjax-dp --help           this text, the shipped configs and every config key"""


def help_text() -> str:
    """What ``--help`` prints: usage, options, the shipped configs, and every key with its default
    and meaning."""
    holders = (
        _CONFIG,
        _WORKDIR,
        _OVERWRITE,
        _RESUME,
        _SEEDS,
        _VECTORIZE,
        _SWEEP,
        _SWEEP_RUNS,
        _SWEEP_NUM_RUNS,
        _SWEEP_BUDGET,
        _SWEEP_METRIC,
        _SWEEP_MODE,
        _SWEEP_SHAPE,
        _IMPORT,
        _TENSORBOARD,
        _PROGRESS,
        _VERBOSE,
        _DISTRIBUTED,
        _COORDINATOR,
        _NUM_PROCESSES,
        _PROCESS_ID,
        _DISTRIBUTED_TIMEOUT,
    )
    options = "\n".join(f"  --{_option_name(h):<20} {FLAGS[h.name].help}" for h in holders)
    environment = (
        f"environment:\n  {ENV:<29} folder of the persistent compilation cache (default "
        f"{default_folder()}; 'off' disables it)"
    )
    return wrapped(
        "\n\n".join(
            [
                USAGE,
                "options:\n" + options,
                environment,
                configs_text(),
                registered_text(),
                "config keys (--config.KEY=VALUE; defaults of training/default_config.py):\n"
                + describe_keys(),
            ]
        )
    )


HELP_WIDTH = 120


def wrapped(text: str, width: int = HELP_WIDTH) -> str:
    """``text`` with every line longer than ``width`` wrapped, its continuation lines indented to
    where the line's description starts (after its name and the gap of two or more spaces)."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        column = re.match(r"\s*\S+(?:\s\S+)*?\s{2,}", line)
        indent = " " * (column.end() if column and column.end() < width // 2 else 4)
        out += textwrap.wrap(
            line,
            width,
            subsequent_indent=indent,
            break_on_hyphens=False,
            drop_whitespace=True,
            replace_whitespace=False,
        )
    return "\n".join(out)


def _option_name(holder) -> str:
    """A flag as the usage line spells it: ``[no]progress`` for a boolean that is on by default."""
    flag = FLAGS[holder.name]
    return f"[no]{holder.name}" if isinstance(flag.default, bool) and flag.default else holder.name


def configs_text() -> str:
    return "shipped configs (--config NAME; a path to a config file works too):\n" + "\n".join(
        f"  {name:<24} {configs.summary(name)}" for name in configs.names()
    )


def registered_text() -> str:
    """The registered models and data sources (yours join them: ``--import``)."""
    from fedjax_dp.data import source_names
    from fedjax_dp.models import model_names

    return (
        "models (--config.model.name; yours: fedjax_dp.register_model in a module given to"
        f" --import):\n  {', '.join(model_names())}\n"
        "data sources (--config.data.source; yours: fedjax_dp.register_data):\n"
        f"  {', '.join(source_names())}"
    )


def _resolve_config_argv(argv: list[str]) -> list[str]:
    """``--config NAME`` / ``--config=NAME[:arg]`` -> the shipped file's path; ``-v`` ->
    ``--verbose``."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            out += ["--config=" + configs.resolve(argv[i + 1])]
            i += 2
            continue
        if arg.startswith("--config="):
            arg = "--config=" + configs.resolve(arg.split("=", 1)[1])
        out.append("--verbose" if arg == "-v" else arg)
        i += 1
    return out


def _one_line(error: BaseException) -> str:
    """A config error as one line naming the key and the closest valid one (and the config file's
    line)."""
    text = str(
        error.args[0] if isinstance(error, (KeyError, AttributeError)) and error.args else error
    )
    text = str(text.args[0]) if isinstance(text, BaseException) else text
    unknown = re.search(r"Unknown command line flag '(config\.[\w.]+)'", text)
    if unknown:
        from fedjax_dp.training.default_config import default_config

        return configs.unknown_key_message(
            unknown.group(1).removeprefix("config."), default_config()
        )
    bad_value = re.match(r"flag --config\.([\w.]+)=(.*?): (.+)", text, re.S)
    if (
        bad_value and bad_value.group(1) in KEY_DOCS
    ):  # a value of the wrong type: say what the key takes
        key, value, reason = bad_value.groups()
        return f"--config.{key}={value}: {' '.join(reason.split())} ({key}: {KEY_DOCS[key]})"
    missing = re.search(
        r"Failed loading config file.*No such file or directory: '([^']+)'", text, re.S
    )
    if missing:
        return f"--config: no such config file {missing.group(1)!r}"
    raised = _raised_by_get_config(error)
    if raised is not None:
        return f"--config={_shipped_name(text)}: {raised}"
    # raised calling get_config, e.g. with an argument it does not take
    if "Error whilst parsing config file" in text:
        inner = _innermost(error)
        return f"--config={_shipped_name(text)}: {type(inner).__name__}: {inner}"
    locked = re.search(r'Key "(\w+)" does not exist', text)
    if locked:
        where = [
            f"{frame.filename}:{frame.lineno}"
            for frame in traceback.extract_tb(error.__traceback__)
            if "get_config" == frame.name
        ]
        close = re.search(r'Did you mean "(\w+)"', text)
        hint = f'; did you mean "{close.group(1)}"?' if close else ""
        return f'{where[-1] + ": " if where else ""}unknown config key "{locked.group(1)}"{hint}'
    return " ".join(text.split())[:600]


def _raised_by_get_config(error: BaseException) -> str | None:
    """The message a config file's ``get_config`` raised, which ml_collections and absl wrap in a
    traceback's text; None when the error came from elsewhere."""
    inner = _innermost(error)
    frames = traceback.extract_tb(inner.__traceback__)
    return (
        str(inner) if inner is not error and any(f.name == "get_config" for f in frames) else None
    )


def _innermost(error: BaseException) -> BaseException:
    """The first exception of ``error``'s chain (what ml_collections and absl wrapped)."""
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    return error


def _shipped_name(text: str) -> str:
    """``--config``'s value as the user wrote it: a shipped file's path back to its name."""
    flag = re.search(r"flag --config=(\S+?): ", text)
    spec = flag.group(1) if flag else "?"
    file, _, argument = spec.rpartition(".py")
    if os.path.dirname(file) == configs.PACKAGE_DIR:
        return os.path.basename(file) + argument
    return spec


def _unknown_override(argv: list[str]) -> str | None:
    """The first ``--config.KEY`` override naming no key (all configs share ``default_config()``'s
    keys)."""
    from fedjax_dp.training.default_config import default_config

    defaults = default_config()
    known = set(configs.all_keys(defaults))
    for arg in argv[1:]:
        match = re.match(r"--(?:no)?config\.([^=]+)", arg)
        if (
            match
            and match.group(1) not in known
            and not (arg.startswith("--noconfig.") and match.group(1) in known)
        ):
            return configs.unknown_key_message(match.group(1), defaults)
    return None


def _override_keys(argv: list[str]) -> tuple[str, ...]:
    """The dotted keys of the ``--config.KEY=VALUE`` (and ``--[no]config.KEY``) overrides."""
    return tuple(
        m.group(1) for m in (re.match(r"--(?:no)?config\.([^=]+)", a) for a in argv[1:]) if m
    )


def parse_seeds(text: str) -> list[int]:
    """``--seeds``' value as distinct integers >= 0 (empty: one run); a ``ValueError`` naming the
    option and the value otherwise."""
    seeds = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if not re.fullmatch(r"\d+", item):
            raise ValueError(
                f"--seeds={text}: every seed must be an integer >= 0 (e.g. --seeds 0,1,2), got"
                f" {item!r}"
            )
        seeds.append(int(item))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"--seeds={text}: the seeds must be distinct, {repeated[0]} is repeated")
    return seeds


def parse_sweep(items: list[str], cfg) -> dict:
    """``--sweep KEY=V1,V2`` options as key -> typed values (each as the key's default's type); a
    ``ValueError`` naming the option and the value otherwise."""
    from fedjax_dp.sweeps import typed_values

    space = {}
    for item in items:
        key, equals, values = item.partition("=")
        key, texts = key.strip(), [v.strip() for v in values.split(",") if v.strip()]
        if not equals or not key or not texts:
            raise ValueError(
                f"--sweep={item}: give KEY=V1,V2,... (e.g. --sweep dp.clip_norm=0.5,1)"
            )
        if key in space:
            raise ValueError(f"--sweep={item}: {key} is swept twice; give its values once")
        try:
            space[key] = typed_values(cfg, key, texts)
        except KeyError as error:
            raise ValueError(f"--sweep={item}: {error.args[0]}") from None
        except ValueError as error:
            raise ValueError(f"--sweep={item}: {error}") from None
    return space


def parse_sweep_options(
    runs: str,
    num_runs: str,
    budget: str,
    metric: str = "test_accuracy",
    mode: str = "max",
    shape: str = "",
) -> dict:
    """``--sweep_runs``, ``--sweep_num_runs``, ``--sweep_budget``, ``--sweep_metric``,
    ``--sweep_mode`` and ``--sweep_shape`` as ``sweep``'s arguments; a ``ValueError`` naming the
    option and the value otherwise."""
    from fedjax_dp.privacy.accounting.selection import RUNS
    from fedjax_dp.sweeps import MODES

    if runs not in RUNS:
        raise ValueError(f"--sweep_runs={runs}: choose one of {', '.join(RUNS)}")
    if mode not in MODES:
        raise ValueError(f"--sweep_mode={mode}: choose one of {', '.join(MODES)}")
    if not metric.strip():
        raise ValueError("--sweep_metric= is empty: name a final metric (e.g. test_accuracy)")
    out = {"runs": runs}
    if metric != "test_accuracy" or mode != "max":
        out.update(metric=metric, mode=mode)
    if shape.strip():
        try:
            eta = float(shape)
        except ValueError:
            eta = math.nan
        if not (math.isfinite(eta) and eta >= 0):
            raise ValueError(f"--sweep_shape={shape}: give a number >= 0 (eta)")
        if runs != "negative_binomial":
            raise ValueError(
                f"--sweep_shape={shape} is read only with --sweep_runs negative_binomial"
            )
        out["shape"] = eta
    for name, text, key in (
        ("sweep_num_runs", num_runs, "num_runs"),
        ("sweep_budget", budget, "budget"),
    ):
        if not text.strip():
            continue
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        least = 1 if key == "num_runs" else 0
        if not (math.isfinite(value) and value >= least and (key == "num_runs" or value > 0)):
            what = "a number >= 1 (runs)" if key == "num_runs" else "a positive epsilon"
            raise ValueError(f"--{name}={text}: give {what}")
        out[key] = int(value) if key == "num_runs" and runs == "fixed" else value
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    if any(a in ("-h", "--help", "--helpfull", "help") for a in argv[1:]):
        print(help_text())
        return 0
    if argv[1:2] == ["configs"]:
        print(configs_text())
        return 0
    unknown = _unknown_override(argv)
    if unknown:
        print(f"error: {unknown}", file=sys.stderr)
        return 2
    try:
        use_a_device_per_core()  # before a config file or anything else starts JAX
        FLAGS(_resolve_config_argv(argv))
        cfg = _CONFIG.value
        _ = cfg.algorithm  # a config file that failed to load raises only when first read
        seeds = parse_seeds(_SEEDS.value)
        space = parse_sweep(_SWEEP.value, cfg)
        sweep_options = parse_sweep_options(
            _SWEEP_RUNS.value,
            _SWEEP_NUM_RUNS.value,
            _SWEEP_BUDGET.value,
            _SWEEP_METRIC.value,
            _SWEEP_MODE.value,
            _SWEEP_SHAPE.value,
        )
        if space and seeds:
            raise ValueError("--sweep and --seeds: give one (sweep the seed: --sweep seed=0,1,2)")
        if _VECTORIZE.value and not (seeds or space):
            raise ValueError(
                "--vectorize trains several runs at once: give --seeds 0,1,2,... or --sweep"
            )
    except Exception as error:  # noqa: BLE001  (any failure to read the command or config: one line)
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2
    given = [
        h.name
        for h in (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID, _DISTRIBUTED_TIMEOUT)
        if h.value is not None
    ]
    if given and not _DISTRIBUTED.value:
        print(f"error: --{given[0]} needs --distributed", file=sys.stderr)
        return 2
    if _DISTRIBUTED.value:
        from fedjax_dp import distributed

        try:
            distributed.initialize(
                _COORDINATOR.value,
                _NUM_PROCESSES.value,
                _PROCESS_ID.value,
                _DISTRIBUTED_TIMEOUT.value,
            )
        except (ValueError, RuntimeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    from fedjax_dp import plugins
    from fedjax_dp.core import hosts
    from fedjax_dp.experiment import Experiment, RunSummary
    from fedjax_dp.sweeps import SweepSummary
    from fedjax_dp.training import console
    from fedjax_dp.training.config_validation import validate_config
    from fedjax_dp.training.fit_to_data import adopt_source_clients
    from fedjax_dp.training.results import ResultsWriteError
    from fedjax_dp.training.workdir_lock import WorkdirInUse, WorkdirUnusable, held_by_process_zero

    try:  # your registrations, before the config that names them is checked
        for spec in _IMPORT.value:
            plugins.import_module(spec)
        plugins.load_entry_points()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    use_persistent_cache()  # before anything compiles: a later run of the same programs loads them

    workdir = _WORKDIR.value or f"results/{cfg.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        # no bar (--noprogress): a line per evaluation and per slow phase
        progress = console.progress_mode(True if _PROGRESS.value else "lines")
        shown = progress if hosts.is_primary() else "off"
        # the workdir first: a second run into it learns at once, not after the calibration
        with held_by_process_zero(workdir), console.shown(shown):
            target = cfg.privacy.get("target_epsilon", 0)
            console.phase(
                "checking the config"
                + (f" and calibrating the noise to epsilon {target:g}" if target else "")
            )
            # what Experiment checks, and the overrides
            adopt_source_clients(cfg, overridden=_override_keys(argv))
            validate_config(cfg, overridden=_override_keys(argv))
            experiment = Experiment(cfg)
            options = dict(
                overwrite=_OVERWRITE.value,
                progress=progress,
                tensorboard=_TENSORBOARD.value,
                verbose=_VERBOSE.value,
            )
            if space:
                from fedjax_dp.sweeps import sweep

                summary = sweep(
                    experiment,
                    space,
                    workdir=workdir,
                    vectorized=_VECTORIZE.value,
                    **sweep_options,
                    **options,
                )
            elif seeds:
                summary = experiment.run_seeds(
                    seeds, workdir, vectorized=_VECTORIZE.value, **options
                )
            else:
                summary = experiment.run(workdir, resume=_RESUME.value, **options)
    except WorkdirUnusable as error:
        print(f"error: --workdir={error.workdir}: {error.reason}", file=sys.stderr)
        return 2
    except (ValueError, FileExistsError, FileNotFoundError, KeyError, WorkdirInUse) as error:
        print(f"error: {error.args[0] if isinstance(error, KeyError) else error}", file=sys.stderr)
        return 2
    except OSError as error:  # a disk that refuses a results file (full, read-only): one line
        written = isinstance(error, ResultsWriteError) and error.strerror
        print(f"error: {error.strerror if written else error}", file=sys.stderr)
        return 1
    if hosts.is_primary():
        print(summary.format())
    if summary.interrupted:
        print(f"interrupted ({summary.stop_reason}): --resume continues it", file=sys.stderr)
        return 130
    if isinstance(summary, SweepSummary) and not summary.runs:
        return 0  # no run was drawn: nothing is released (the summary says so)
    if (summary.rounds if isinstance(summary, RunSummary) else summary.rounds_min) == 0:
        print(f"error: no round could run ({summary.stop_reason})", file=sys.stderr)
        return 1
    if summary.diverged:
        print(f"error: {summary.stop_reason}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
