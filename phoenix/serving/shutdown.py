"""How `serve` stops (docs/reliability.md, "Shutdown"): on the first SIGINT/SIGTERM, /ready
answers 503 at once (drain); after `--drain-seconds` every model is unloaded through the admin
API, ensembles first, and we wait, up to `--stop-timeout`, until Triton has answered the requests
in flight (it refuses new ones to an unloading model); then SIGTERM to tritonserver, which only
waits its short exit timeout for idle keep-alive connections and exits 0. Without the unloads,
keep-alive clients kept feeding the models through Triton's whole exit timeout, and it exited 1
("Exit timeout expired") or 139. A second signal kills tritonserver; every non-zero exit says why.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from phoenix.serving.supervisor.admin import TritonAdmin, TritonAPIError
from phoenix.serving.supervisor.state import Supervisor
from phoenix.serving.triton_server import TritonServer

EXIT_TIMEOUT_EXPIRED = "Exit timeout expired"


def wait_in_short_naps(wait: Callable[[float], int], nap_s: float = 0.1) -> int:
    """`wait(timeout)` until it returns, waking every `nap_s` seconds.

    Python runs signal handlers only in the main thread, and only once that thread runs bytecode
    again. The kernel may deliver SIGTERM to any thread (the supervisor's, the /ready server's);
    a main thread blocked in one long waitpid() would then not run the drain handler until
    tritonserver had exited on its own. Short naps bound that delay to `nap_s`.
    """
    while True:
        try:
            return wait(nap_s)
        except subprocess.TimeoutExpired:
            continue


def models_in(admin: TritonAdmin, states: Callable[[str], bool]) -> list[str]:
    return [m for m, (state, _) in sorted(admin.model_index().items()) if states(state)]


def unload_everything(admin: TritonAdmin) -> list[str]:
    """Ask Triton to unload every loaded model, ensembles first (so no ensemble is left pointing
    at a missing step); returns what could not be asked."""
    loaded = models_in(admin, lambda state: state == "READY")
    ensembles = [m for m in loaded if admin.model_config(m).get("platform") == "ensemble"]
    problems = []
    for model in ensembles + [m for m in loaded if m not in ensembles]:
        try:
            admin.unload_model(model)
        except TritonAPIError as error:
            problems.append(f"{model}: {error}")
    return problems


def wait_until_unloaded(admin: TritonAdmin, timeout_s: float, poll_s: float = 0.1) -> list[str]:
    """Wait until every model is unloaded; returns those still READY, LOADING or UNLOADING (an
    unloading model still has requests in flight) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := models_in(admin, lambda s: s != "UNAVAILABLE")) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return left


class Shutdown:
    """The signal handling of a foreground server (install() from the main thread)."""

    def __init__(
        self,
        server: TritonServer,
        supervisor: Supervisor | None = None,
        drain_seconds: float = 0.0,
        stop_timeout_s: float = 30.0,
    ):
        self.server, self.supervisor = server, supervisor
        # Unloading before the stop needs explicit model control, which the supervisor brings.
        self.admin = supervisor.admin if supervisor is not None else None
        self.drain_seconds, self.stop_timeout_s = drain_seconds, stop_timeout_s
        self.signals: list[int] = []
        self.started_at: float | None = None
        self.overran = ""  # why the stop took longer than its limit

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def _handle(self, signum, _frame) -> None:
        self.signals.append(signum)
        name = signal.Signals(signum).name
        if len(self.signals) > 1:
            self._say(f"\n{name} again: killing tritonserver without waiting for requests")
            self.server.kill()
            return
        self.started_at = time.monotonic()
        then = "then stopping; a second signal kills the server"
        self._say(f"\n{name}: draining for {self.drain_seconds:g} s (/ready answers 503), {then}")
        if self.supervisor is not None:
            self.supervisor.drain()
        threading.Thread(target=self._stop_serving, daemon=True, name="phoenix-stop").start()

    def _stop_serving(self) -> None:
        time.sleep(self.drain_seconds)
        if self.admin is not None:
            try:
                for problem in unload_everything(self.admin):
                    self._say(f"stopping: could not unload {problem}")
                left = wait_until_unloaded(self.admin, self.stop_timeout_s)
            except TritonAPIError as error:
                left = [f"(Triton did not answer: {error})"]
            if left:
                self.overran = (
                    f"models still loaded {self.stop_timeout_s:g} s after the unload: "
                    f"{', '.join(left)} (a request that does not finish, or a stub that died "
                    "earlier and cannot be unloaded)"
                )
                self._say(f"stopping: {self.overran}")
        self.server.send_signal(signal.SIGTERM)

    def _why_it_failed(self, returncode: int, code: int) -> str:
        if EXIT_TIMEOUT_EXPIRED not in self.server.log_tail(200):
            died = returncode < 0 or code > 128
            return f"tritonserver died of signal {code - 128}" if died else "tritonserver failed"
        why = "the stop outlived Triton's exit timeout: a request still in flight or a model that "
        why += "could not be unloaded"
        events = self.supervisor.events if self.supervisor is not None else []
        healed = sorted({e["model"] for e in events if e["event"] == "reloaded"})
        if healed:
            why += f"; here the version of {', '.join(healed)} whose stub died before the "
            why += "supervisor reloaded it (Triton 2.51 never finishes unloading it)"
        return why

    def exit_code(self, returncode: int) -> int:
        """Our exit code for tritonserver's `returncode`, with the reason on stderr when it is not
        a clean stop."""
        if len(self.signals) > 1:
            self._say("exit: killed on a second signal; in-flight requests may have been cut")
            return 128 + self.signals[-1]
        if self.overran:
            self._say(f"exit 1: the stop outlived its limit: {self.overran}")
            return 1
        if returncode == 0:
            if self.started_at is not None:
                seconds = time.monotonic() - self.started_at
                self._say(f"stopped cleanly {seconds:.1f} s after the signal")
            return 0
        code = 128 - returncode if returncode < 0 else returncode
        self._say(
            f"exit {code}: {self._why_it_failed(returncode, code)}; see {self.server.log_path}"
        )
        return code
