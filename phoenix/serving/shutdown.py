"""How `serve` stops: drain, stop taking requests, let in-flight ones finish, exit 0.

First SIGINT/SIGTERM:
1. drain: the supervisor's /ready answers 503 at once, so load balancers stop sending;
2. after `--drain-seconds`, unload every model through the admin API (ensembles first).
   Triton refuses new requests to an unloading model at once (the client sees "... has no
   available versions", safe to retry elsewhere) and finishes unloading it when its in-flight
   requests have been answered. We wait for that, up to `--stop-timeout` seconds;
3. then SIGTERM to tritonserver, which has no request left to wait for: it waits at most its
   short exit timeout for idle HTTP keep-alive connections, closes its ports and exits 0.

Without step 2, keep-alive HTTP connections kept feeding the models through Triton's whole
exit timeout, and Triton then exited 1 ("Exit timeout expired"), sometimes 139 (a crash in its
teardown). A second signal kills tritonserver at once; a stop whose unloads outlive
`--stop-timeout` (a request that never finishes, a model whose stub died earlier and cannot be
unloaded) is finished by Triton's exit timeout. Both exit non-zero and say why.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from phoenix.serving.supervisor import Supervisor, TritonAdmin, TritonAPIError
from phoenix.serving.triton_server import TritonServer

EXIT_TIMEOUT_EXPIRED = "Exit timeout expired"


def wait_in_short_naps(wait: Callable[[float], int], nap_s: float = 0.1) -> int:
    """`wait(timeout)` until it returns, waking every `nap_s` seconds.

    Python runs signal handlers only in the main thread, and only once that thread runs
    bytecode again. The kernel may deliver SIGTERM to any thread (the supervisor's, the /ready
    server's); a main thread blocked in one long waitpid() would then not run the drain handler
    until tritonserver had exited on its own. Short naps bound that delay to `nap_s`.
    """
    while True:
        try:
            return wait(nap_s)
        except subprocess.TimeoutExpired:
            continue


def unload_everything(admin: TritonAdmin) -> list[str]:
    """Ask Triton to unload every loaded model, ensembles first (so no ensemble is left
    pointing at a missing step); returns what could not be asked."""
    loaded = [m for m, (state, _) in sorted(admin.model_index().items()) if state == "READY"]
    ensembles = [m for m in loaded if admin.model_config(m).get("platform") == "ensemble"]
    problems = []
    for model in ensembles + [m for m in loaded if m not in ensembles]:
        try:
            admin.unload_model(model)
        except TritonAPIError as error:
            problems.append(f"{model}: {error}")
    return problems


def still_loaded(admin: TritonAdmin) -> list[str]:
    """Models READY, LOADING or UNLOADING (an unloading model still has requests in flight)."""
    return [m for m, (state, _) in sorted(admin.model_index().items()) if state != "UNAVAILABLE"]


def wait_until_unloaded(admin: TritonAdmin, timeout_s: float, poll_s: float = 0.1) -> list[str]:
    """Wait until every model is unloaded; returns those still loaded after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := still_loaded(admin)) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return left


class Shutdown:
    """The signal handling of a foreground server (install() from the main thread)."""

    def __init__(
        self,
        server: TritonServer,
        admin: TritonAdmin | None,
        supervisor: Supervisor | None = None,
        drain_seconds: float = 0.0,
        stop_timeout_s: float = 30.0,
        out: TextIO = sys.stderr,
    ):
        self.server, self.admin, self.supervisor = server, admin, supervisor
        self.drain_seconds = drain_seconds
        self.stop_timeout_s = stop_timeout_s
        self.out = out
        self.signals: list[int] = []
        self.started_at: float | None = None
        self.overran: str = ""  # why the stop took longer than its limit

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _handle(self, signum, _frame) -> None:
        self.signals.append(signum)
        name = signal.Signals(signum).name
        if len(self.signals) > 1:
            self._say(f"\n{name} again: killing tritonserver without waiting for requests")
            self.server.kill()
            return
        self.started_at = time.monotonic()
        self._say(
            f"\n{name}: draining for {self.drain_seconds:g} s (/ready answers 503), then "
            "stopping; a second signal kills the server"
        )
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

    def healed_models(self) -> list[str]:
        """Models the supervisor reloaded after a death during this run."""
        if self.supervisor is None:
            return []
        return sorted({e["model"] for e in self.supervisor.events if e["event"] == "reloaded"})

    def exit_code(self, returncode: int) -> int:
        """Our exit code for tritonserver's `returncode`, with the reason on `out` when it is
        not a clean stop."""
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
        if EXIT_TIMEOUT_EXPIRED in self.server.log_tail(200):
            why = (
                "the stop outlived Triton's exit timeout: a request still in flight or a model "
                "that could not be unloaded"
            )
            healed = self.healed_models()
            if healed:
                why += (
                    f"; here the version of {', '.join(healed)} whose stub died before the "
                    "supervisor reloaded it (Triton 2.51 never finishes unloading it)"
                )
        elif returncode < 0 or code > 128:
            why = f"tritonserver died of signal {abs(returncode) if returncode < 0 else code - 128}"
        else:
            why = "tritonserver failed"
        self._say(f"exit {code}: {why}; see {self.server.log_path}")
        return code
