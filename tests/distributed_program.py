"""``fedjax-dp --distributed ARGS`` with two test hooks, the program ``tests/test_distributed.py``
launches (``fedjax-dp-launch -n 2 -- python tests/distributed_program.py [hooks] -- ARGS``); not a
test module.

    --kill_at_round K   process 1 kills itself (SIGKILL, no clean-up) when round K has trained
    --writes_log FILE   every process but 0 records each path under the workdir it opened for
                        writing, created, renamed or removed (Python's file calls), one per line in
                        FILE.<process>, at exit
"""

import atexit
import builtins
import os
import shutil
import signal
import sys


def _arguments(argv):
    hooks, rest = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    options = dict(zip(hooks[::2], hooks[1::2]))
    return options.get("--kill_at_round"), options.get("--writes_log"), rest


def _kill_at(round_index: int) -> None:
    from fedjax_dp.training.checkpointing import Interruption

    real, calls = Interruption.synchronize, []

    def synchronize(self):  # the loop calls it once after each round has trained, on every process
        calls.append(1)
        if len(calls) == round_index:
            os.kill(os.getpid(), signal.SIGKILL)
        real(self)

    Interruption.synchronize = synchronize


def _record_writes(workdir: str, log: str) -> None:
    workdir, writes = os.path.realpath(workdir), []

    def under(path) -> bool:
        try:
            return os.path.realpath(os.fspath(path)).startswith(workdir)
        except TypeError:  # a file descriptor
            return False

    def spy(function, is_write=lambda *a, **k: True):
        def wrapped(path, *args, **kwargs):
            if under(path) and is_write(path, *args, **kwargs):
                writes.append(f"{function.__name__} {path}")
            return function(path, *args, **kwargs)

        return wrapped

    writing = lambda path, mode="r", *a, **k: any(c in mode for c in "wax+")  # noqa: E731
    builtins.open = spy(builtins.open, writing)
    for module, name in (
        (os, "makedirs"),
        (os, "mkdir"),
        (os, "remove"),
        (os, "unlink"),
        (os, "replace"),
        (os, "rename"),
        (shutil, "rmtree"),
        (shutil, "move"),
    ):
        setattr(module, name, spy(getattr(module, name)))
    atexit.register(
        lambda: open(f"{log}.{os.environ['FEDJAX_DP_PROCESS_ID']}", "w").write("\n".join(writes))
    )


def main() -> int:
    kill_at, writes_log, rest = _arguments(sys.argv[1:])
    process = int(os.environ["FEDJAX_DP_PROCESS_ID"])
    if kill_at and process == 1:
        _kill_at(int(kill_at))
    if writes_log and process != 0:
        workdir = next(a.split("=", 1)[1] for a in rest if a.startswith("--workdir="))
        _record_writes(workdir, writes_log)
    from fedjax_dp.cli import main as cli

    return cli(["fedjax-dp", "--distributed", *rest])


if __name__ == "__main__":
    sys.exit(main())
