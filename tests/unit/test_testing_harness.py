"""The pure parts of harness, the harness tests and benchmarks share: the serve command
line, process groups stopped and killed, bounded waiting, results and Locust files read back."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from harness.locust_runs import TOTALS_SUFFIX, failure_kinds, locust_totals
from harness.polling import wait_until
from harness.results import write_results
from harness.serve_process import ServePorts, ServeProcess, serve_command
from harness.triton import triton_server
from phoenix.util.processes import LoggedProcess, is_alive

# A parent that ignores SIGTERM and starts a child that ignores it too; it prints the child's pid.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_serve_command_puts_each_port_on_its_option(tmp_path):
    ports = ServePorts(1001, 1002, 1003, 1004)
    command = serve_command(ports, tmp_path / "a", tmp_path / "b", 1.5, ["--corpus", "x"])
    assert command[:3] == [sys.executable, "-m", "phoenix.ops.serve"]
    assert [option(command, f"--{n}-port") for n in ("http", "grpc", "metrics", "supervisor")] == [
        "1001", "1002", "1003", "1004",
    ]  # fmt: skip
    assert option(command, "--artifacts") == str(tmp_path / "a")
    assert option(command, "--build-dir") == str(tmp_path / "b")
    assert option(command, "--drain-seconds") == "1.5"
    assert "--quiet" in command and command[-2:] == ["--corpus", "x"]


def test_free_serve_ports_are_four_distinct_ports():
    ports = ServePorts.free()
    assert len(set(ports)) == 4 and all(0 < p < 65536 for p in ports)


def test_each_serve_start_takes_new_ports_and_a_new_log(tmp_path):
    """Started with a stand-in command (`wrap`): serve itself is not needed for the bookkeeping."""
    serve = ServeProcess(tmp_path, tmp_path / "work", 0.0,
                         wrap=lambda command: [sys.executable, "-c", "print('up')"])  # fmt: skip
    logs, urls = [], []
    for _ in range(2):
        serve.start()
        assert serve.wait_exit(30) == 0
        logs.append(serve.log)
        urls.append(serve.ready_url)
    assert [log.name for log in logs] == ["serve.out", "serve-2.out"]
    assert all(log.read_text() == "up\n" for log in logs)
    assert urls[1] == f"http://127.0.0.1:{serve.ports.ready}/ready"  # the last start's
    assert serve.build_dir == tmp_path / "work" / "build"


def test_stop_sends_sigterm_and_kills_the_group_when_it_is_ignored(tmp_path):
    process = LoggedProcess([sys.executable, "-c", STUBBORN], tmp_path / "out.log").start()
    assert wait_until(lambda: process.log.read_text().strip(), 30, 0.05)
    child = int(process.log.read_text())
    started = time.monotonic()
    code = process.stop(timeout_s=0.5)
    assert code == -signal.SIGKILL  # SIGTERM was ignored, so the bound passed
    assert time.monotonic() - started < 10
    # The child went with its parent's group; it may linger as a zombie of its dead parent
    # only until init reaps it.
    assert wait_until(lambda: not is_alive(child), 10, 0.05), f"child {child} outlived the stop"


def test_stop_returns_the_exit_code_of_a_process_that_exits_on_sigterm(tmp_path):
    process = LoggedProcess([sys.executable, "-c", "import time; time.sleep(60)"],
                            tmp_path / "out.log").start()  # fmt: skip
    assert process.is_running()
    assert process.stop(timeout_s=30) == -signal.SIGTERM
    assert process.stop(timeout_s=30) == -signal.SIGTERM  # stopping again changes nothing


def test_a_failure_names_the_exit_code_and_the_logs_last_lines(tmp_path):
    code = "print('first'); print('last words'); raise SystemExit(3)"
    process = LoggedProcess([sys.executable, "-c", code], tmp_path / "out.log").start()
    assert process.wait_exit(30) == 3
    message = process.failure("serve exited")
    assert "serve exited (exit code 3)" in message and "last words" in message
    assert str(tmp_path / "out.log") in message


def test_logged_process_passes_its_environment(tmp_path):
    command = [sys.executable, "-c", "import os; print(os.environ['HARNESS_MARK'])"]
    env = dict(os.environ, HARNESS_MARK="here")
    process = LoggedProcess(command, tmp_path / "out.log", env=env).start()
    assert process.wait_exit(30) == 0 and process.log.read_text() == "here\n"


def test_wait_until_returns_when_the_condition_first_holds_or_none():
    start = time.monotonic()
    assert wait_until(lambda: time.monotonic() - start > 0.1, 5, 0.01) >= start + 0.1
    assert wait_until(lambda: False, 0.1, 0.01) is None


def test_triton_server_turns_keywords_into_options(tmp_path):
    server = triton_server(tmp_path, exit_timeout_secs=5, model_control_mode="explicit",
                           load_model=["a", "b"], env={"X": "1"})  # fmt: skip
    assert "--exit-timeout-secs=5" in server.extra_args
    assert "--model-control-mode=explicit" in server.extra_args
    assert "--load-model=a" in server.extra_args and "--load-model=b" in server.extra_args
    assert server.env_overrides == {"X": "1"}


def test_results_are_written_as_json_in_a_new_folder(tmp_path):
    path = write_results(tmp_path / "new" / "r.json", {"a": 1, "b": [1.5]})
    assert json.loads(path.read_text()) == {"a": 1, "b": [1.5]}
    assert path.read_text().endswith("\n")


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    lines = [",".join(header)] + [",".join(f'"{v}"' for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_locust_totals_read_the_aggregated_row(tmp_path):
    write_csv(tmp_path / "s_stats.csv", ["Type", "Name", "Request Count", "Failure Count"],
              [["POST", "recommend", 7, 1], ["", "Aggregated", 12, 2]])  # fmt: skip
    assert locust_totals(tmp_path / "s") == (12, 2)
    assert locust_totals(tmp_path / "missing") == (0, 0)


def test_locust_totals_prefer_the_totals_locust_saved_at_exit(tmp_path):
    write_csv(tmp_path / "s_stats.csv", ["Type", "Name", "Request Count", "Failure Count"],
              [["", "Aggregated", 12, 2]])  # fmt: skip
    (tmp_path / f"s{TOTALS_SUFFIX}").write_text('{"requests": 15, "failures": 3}\n')
    assert locust_totals(tmp_path / "s") == (15, 3)  # the CSV missed the last requests


def test_locust_failures_are_counted_by_kind(tmp_path):
    failures = write_csv(tmp_path / "s_failures.csv", ["Method", "Name", "Error", "Occurrences"], [
        ["POST", "a", "ConnectionRefusedError: Connection refused", 3],
        ["POST", "a", "Connection reset by peer", 2],
        ["POST", "a", "InferenceServerException()", 4],
        ["POST", "a", "wrong answer: 3 posts", 1],
    ])  # fmt: skip
    kinds = failure_kinds(failures)
    assert kinds["refused"] == 3 and kinds["cut"] == 2 and kinds["unclassified"] == 4
    assert kinds["other"] == 1 and kinds["other: wrong answer: 3 posts"] == 1
