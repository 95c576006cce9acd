"""The results directory: ``config.json``, ``metrics.jsonl``, ``summary.json``, ``privacy.json`` and
``results.png``. Every file is strict JSON (RFC 8259): a non-finite number is written as ``null``
with a sibling key ``<key>_nonfinite`` saying which it was ("nan", "inf" or "-inf"), so ``jq`` and
``JSON.parse`` read every file.

A file is written whole or not at all (a temporary file renamed into place), and a metrics row is
one write; a write the disk refuses (full, read-only) is one line naming the path and the free space
(``ResultsWriteError``). ``--overwrite`` removes every artefact of the earlier run, checkpoints
included, before the first round (``prepare_workdir``)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import shutil

import numpy as np
from flax.traverse_util import flatten_dict


def config_differences(saved: dict, current: dict, defaults: dict) -> list[str]:
    """``key: saved X, now Y`` for each key whose value differs. A key the saved config lacks is no
    difference when this run leaves it at its default (a key added to the library after the run
    started: its default keeps the old behaviour)."""
    saved, current, defaults = (flatten_dict(c, sep=".") for c in (saved, current, defaults))
    missing = object()
    differences = []
    for key in sorted(set(saved) | set(current)):
        before, now = saved.get(key, missing), current.get(key, missing)
        if before is missing and key in defaults and now == defaults[key]:
            continue
        if before != now:
            differences.append(
                f"{key}: saved {'(absent)' if before is missing else repr(before)}, "
                f"now {'(absent)' if now is missing else repr(now)}"
            )
    return differences


def check_resumable(workdir: str, config_json: str, defaults_json: str | None = None) -> None:
    """Raises ``ValueError`` naming the differences if ``workdir``'s ``config.json`` is not this
    run's config (up to keys added to the library since, left at their defaults in
    ``defaults_json``); nothing if ``workdir`` holds no ``config.json``. A ``FileNotFoundError``
    where there is nothing to resume (no run there) or the run's ``metrics.jsonl`` is gone (the rows
    before its checkpoint could not be restored)."""
    has_metrics = os.path.exists(os.path.join(workdir, "metrics.jsonl"))
    if not has_metrics and not os.path.isdir(os.path.join(workdir, "checkpoints")):
        raise FileNotFoundError(
            f"--resume: no run to continue in {workdir} (no metrics.jsonl, no checkpoints); run"
            " without --resume to start one"
        )
    if not has_metrics:
        raise FileNotFoundError(
            f"--resume: {workdir} holds checkpoints but no metrics.jsonl, so the rows of the rounds"
            " before its newest checkpoint are lost; start the run again with --overwrite"
        )
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return  # no run there: the checkpoint's absence is reported where it is read
    with open(path) as f:
        saved = json.loads(f.read())
    defaults = json.loads(defaults_json) if defaults_json else {}
    differences = config_differences(saved, json.loads(config_json), defaults)
    if differences:
        raise ValueError(
            f"cannot resume {workdir}: its config.json differs from this run's config: "
            + "; ".join(differences[:8])
            + (" ..." if len(differences) > 8 else "")
        )


RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "privacy.json",
    "client_accuracies.json",
    "results.png",
)
RUN_FOLDERS = ("checkpoints", "tensorboard")
"""What a run writes into its workdir (``prepare_workdir`` removes them for ``--overwrite``)."""


def prepare_workdir(workdir: str, overwrite: bool) -> None:
    """Refuses a workdir that holds an earlier run's artefacts unless ``overwrite``, which removes
    them all."""
    found = [
        name for name in RUN_FILES + RUN_FOLDERS if os.path.exists(os.path.join(workdir, name))
    ]
    if found and not overwrite:
        raise FileExistsError(
            f"{workdir} holds an earlier run ({', '.join(found)}): choose another --workdir, pass "
            "--overwrite to replace that run, or --resume to continue it"
        )
    for name in found:
        path = os.path.join(workdir, name)
        with _writing(path):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


class ResultsWriteError(OSError):
    """A results file the disk would not take; the message (``strerror``) is one line naming it and
    the free space, ``filename`` the file."""


def attempt_each(steps) -> None:
    """Runs every one of ``steps`` (callables without arguments), in order, even after one has
    failed, then raises the first failure: a full disk costs the files it cannot take, never the
    ones after them. A results file that could not be written names the others that could not
    either, in its one line."""
    errors = []
    for step in steps:
        try:
            step()
        except Exception as error:  # noqa: BLE001  (raised below, after the other steps)
            errors.append(error)
    if not errors:
        return
    first, others = errors[0], errors[1:]
    if others and isinstance(first, ResultsWriteError):
        lost = ", ".join(
            os.path.basename(e.filename) if getattr(e, "filename", None) else _first_words(e)
            for e in others
        )
        raise ResultsWriteError(
            first.errno, f"{first.strerror}; also not written: {lost}", first.filename
        ) from None
    for error in others:
        logging.warning("also failed at the end of the run: %s", _first_words(error))
    raise first


def _first_words(error: BaseException) -> str:
    text = " ".join(str(getattr(error, "strerror", None) or error).split())
    return text[:120]


DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


@contextlib.contextmanager
def _writing(path: str):
    try:
        yield
    except OSError as error:
        if error.errno not in DISK_ERRORS or isinstance(error, ResultsWriteError):
            raise
        raise ResultsWriteError(
            error.errno, f"cannot write {path}: {error.strerror}; {free_space(path)}", path
        ) from None


def free_space(path: str) -> str:
    """'N MB free on the disk of PATH' (or why that is unknown)."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    try:
        return f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free on the disk of {folder}"
    except OSError as error:
        return f"free space unknown ({error.strerror})"


def _replace_whole(path: str, text: str) -> None:
    """``path`` holds ``text`` or its old content, never a part: written beside it, then renamed."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with _writing(path):
        try:
            with open(temporary, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)


class ResultsWriter:
    """Appends one JSON line per round; refuses to overwrite a previous run unless told to."""

    def __init__(
        self,
        workdir: str,
        config_json: str,
        overwrite: bool = False,
        append: bool = False,
        scalars=None,
        defaults_json: str | None = None,
    ):
        """``append``: continue a resumed run's ``metrics.jsonl`` (its config must be the same, up
        to keys added to the library since it started that this run leaves at their defaults,
        ``defaults_json``); ``scalars``: also given every row
        (``tensorboard.TensorBoardScalars``)."""
        self.workdir, self.scalars = workdir, scalars
        self.metrics_path = os.path.join(workdir, "metrics.jsonl")
        if append:
            check_resumable(workdir, config_json, defaults_json)
            # lost; the checkpoint verified the config
            if not os.path.exists(os.path.join(workdir, "config.json")):
                _replace_whole(os.path.join(workdir, "config.json"), config_json)
            with _writing(self.metrics_path):
                self._file = open(self.metrics_path, "a")
            return
        if not overwrite:
            prepare_workdir(workdir, overwrite=False)
        with _writing(workdir):
            os.makedirs(workdir, exist_ok=True)
        _replace_whole(os.path.join(workdir, "config.json"), config_json)
        with _writing(self.metrics_path):
            self._file = open(self.metrics_path, "w")

    def log(self, row: dict) -> None:
        # one write and a flush: a row is whole (a torn last one is dropped on resume)
        with _writing(self.metrics_path):
            self._file.write(dumps(row) + "\n")
            self._file.flush()
        if self.scalars is not None:
            self.scalars.log(row)

    def write_json(self, name: str, payload: dict) -> str:
        path = os.path.join(self.workdir, name)
        _replace_whole(path, dumps(payload, indent=2))
        return path

    def close(self) -> None:
        self._file.close()
        if self.scalars is not None:
            self.scalars.close()


class DiscardingWriter:
    """A ``ResultsWriter`` that writes nothing: the one of every process but process 0 under several
    processes (``core.hosts``), which computes the same rows."""

    def __init__(self, workdir: str):
        self.workdir = workdir

    def log(self, row: dict) -> None:
        pass

    def write_json(self, name: str, payload: dict) -> str:
        return os.path.join(self.workdir, name)

    def close(self) -> None:
        pass


def dumps(value, indent: int | None = None) -> str:
    """Strict JSON of ``value`` (numpy scalars and arrays converted; non-finite numbers as described
    in the module docstring; other objects as their ``str``); ``allow_nan=False`` makes any that
    slipped through an error, not a file that strict parsers reject."""
    return json.dumps(_jsonable(value), indent=indent, allow_nan=False, default=str)


def write_json(path: str, value, indent: int | None = 1) -> None:
    """Write ``value`` to ``path`` as strict JSON (``dumps``), whole or not at all, creating the
    folder it goes in."""
    with _writing(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _replace_whole(path, dumps(value, indent=indent))


def _nonfinite_name(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _jsonable(value):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            item = _jsonable(item)
            if isinstance(item, float) and not math.isfinite(item):
                out[f"{key}_nonfinite"] = _nonfinite_name(item)
                item = None
            out[key] = item
        return out
    if isinstance(value, (list, tuple, np.ndarray)):  # a non-finite entry of a list: null
        items = [_jsonable(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
        return [None if isinstance(v, float) and not math.isfinite(v) else v for v in items]
    if hasattr(value, "item") and np.ndim(value) == 0:
        return value.item()
    return value


def read_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def dropped_updates(metrics: list[dict]) -> int:
    """Client updates kept out of the model as non-finite over a run's ``metrics.jsonl`` rows."""
    return int(sum(row.get("dropped_clients") or 0 for row in metrics))
