"""The serve command's main thread must run the SIGTERM drain handler promptly, even when the
kernel hands the signal to another of its threads (the supervisor's or the /ready server's)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from phoenix.ops.serve import wait_in_short_naps

REPO_ROOT = Path(__file__).resolve().parents[2]

# The main thread blocks SIGTERM, so the kernel must deliver it to the helper thread: the
# situation that left a main thread stuck in waitpid() while /ready kept answering 200.
SCRIPT = textwrap.dedent(
    """
    import signal, subprocess, sys, threading, time
    from phoenix.ops.serve import wait_in_short_naps

    helper = threading.Thread(target=time.sleep, args=(60,), daemon=True)
    helper.start()  # created before the mask below, so it keeps SIGTERM deliverable
    child = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print("waiting", child.pid, flush=True)
    code = wait_in_short_naps(child.wait) if sys.argv[1] == "naps" else child.wait()
    print("child exited", code, flush=True)
    """
)


# wait4 and waitid on x86-64 and on arm64: the syscalls a blocking Popen.wait() sits in.
WAIT_SYSCALLS = {"61", "247", "260", "95"}


def wait_until_blocked_in_waitpid(pid: int, limit_s: float = 10.0) -> None:
    """Until the main thread of ``pid`` sits in waitpid(): a signal sent before that would be
    handled on the way there (a busy machine can take that long), not missed."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
        except (OSError, IndexError):
            return  # no /proc: fall back to the time readline() took
        if syscall in WAIT_SYSCALLS:
            return
        time.sleep(0.01)
    pytest.fail(f"the script's main thread never blocked in waitpid within {limit_s} s")


def run_and_terminate(mode: str) -> tuple[float, str]:
    """Seconds from SIGTERM to the script's exit, and what it printed."""
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, mode], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    word, child_pid = process.stdout.readline().split()
    assert word == "waiting"
    if mode == "plain":
        wait_until_blocked_in_waitpid(process.pid)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=3)
        return time.monotonic() - sent, out
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        return float("inf"), out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(child_pid), signal.SIGKILL)


def test_short_naps_run_the_handler_when_another_thread_took_the_signal():
    seconds, out = run_and_terminate("naps")
    assert seconds < 2.0
    assert out.strip() == f"child exited {-signal.SIGTERM}"


def test_one_long_wait_misses_the_handler_which_is_why_naps_exist():
    seconds, _ = run_and_terminate("plain")
    assert seconds == float("inf")


def test_wait_in_short_naps_returns_the_exit_code_and_retries_on_timeouts():
    calls = []

    def wait(timeout: float) -> int:
        calls.append(timeout)
        if len(calls) < 3:
            raise subprocess.TimeoutExpired("tritonserver", timeout)
        return 7

    assert wait_in_short_naps(wait, nap_s=0.25) == 7
    assert calls == [0.25, 0.25, 0.25]


@pytest.mark.parametrize("code", [0, 3])
def test_wait_in_short_naps_on_a_real_process(code):
    process = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])
    assert wait_in_short_naps(process.wait) == code
