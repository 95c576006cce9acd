"""``fedjax-dp-launch`` keeps the runtime's own records (XLA's coordination service, gloo, a dying
process's stack trace) off the terminal: 25 lines around the one that said what happened."""

from __future__ import annotations

import io

from fedjax_dp.launch_output import RuntimeOutput, forward, log_path

# process 0's output when process 1 was killed (fedjax-dp-launch -n 2, the 2-core VM), shortened
DYING = "".join(
    line + "\n"
    for line in (
        "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is 1",
        "checking the config",
        "loading data: mnist_5k, shards partition",
        "E1207 05:30:12.401975   20454 coordination_service.cc:1549] [123] Use error polling:"
        " UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):",
        "1",
        "The tasks have crashed. Check the task logs for an earlier error.",
        "E1207 05:30:12.402560   20465 coordination_service_agent.cc:289] Polled an error.",
        "F1207 05:30:12.402688   20465 client.h:80] Terminating process because the JAX"
        " distributed service detected fatal errors.",
        "1",
        "",
        "RPC: /xla.coordination.CoordinationService/PollForError",
        "*** Check failure stack trace: ***",
        "    @     0x7f43e1e40634  absl::lts_20260107::log_internal::LogMessage::SendToLog()",
        "    @     0x7f43e98a71f5  (unknown)",
    )
)


def test_the_runtimes_records_go_to_the_log_and_the_processes_lines_to_the_terminal(tmp_path):
    runtime = RuntimeOutput(str(tmp_path / "w" / "launch.log"))
    terminal = io.StringIO()
    forward(io.BytesIO(DYING.encode()), "", terminal, runtime)
    assert terminal.getvalue() == "checking the config\nloading data: mnist_5k, shards partition\n"
    logged = (tmp_path / "w" / "launch.log").read_text()
    assert logged.startswith("[Gloo] Rank 0") and logged.endswith("(unknown)\n")
    assert runtime.lines == len(DYING.splitlines()) - 2


def test_a_clean_runs_gloo_lines_leave_no_log_and_an_error_after_a_record_is_shown(tmp_path):
    runtime = RuntimeOutput(str(tmp_path / "launch.log"))
    terminal = io.StringIO()
    lines = (
        "[Gloo] Rank 1 is connected to 1 peer ranks.\n"
        "W1207 05:30:12.401975   20454 x.cc:1] a warning\n"
        "continued\n"
        "error: --resume: no checkpoint under w/checkpoints\n"
    )
    forward(io.BytesIO(lines.encode()), "[process 1] ", terminal, runtime)
    assert terminal.getvalue() == "[process 1] error: --resume: no checkpoint under w/checkpoints\n"
    clean = RuntimeOutput(str(tmp_path / "clean.log"))
    forward(io.BytesIO(b"[Gloo] Rank 0 is connected\n"), "", io.StringIO(), clean)
    assert not clean.written() and runtime.written()


def test_the_log_is_in_the_runs_workdir():
    assert log_path(["--config=x", "--workdir=results/a"]) == "results/a/launch.log"
    assert log_path(["--workdir", "results/b"]) == "results/b/launch.log"
    assert log_path(["python", "my_script.py"]) == "launch.log"
