"""Text written for a reader elsewhere names no folder of the machine that wrote it."""

from __future__ import annotations

import sys
import sysconfig
import tempfile
from pathlib import Path

from harness.results import shown_path
from phoenix.util.machine_paths import CHECKOUT, main, portable_text


def test_machine_paths_are_rewritten_and_other_text_kept(monkeypatch):
    monkeypatch.setattr(sys, "prefix", "/opt/env")  # a Python environment outside the checkout
    stdlib = sysconfig.get_paths()["stdlib"]
    temporary = Path(tempfile.gettempdir()).resolve()
    text = "\n".join([
        f"{CHECKOUT}/phoenix/stub/profile.py:70(save)",
        "/opt/torch/.venv/lib/python3.12/site-packages/jax/_src/api.py:2035(device_put)",
        f"{stdlib}/functools.py:981(__get__)",
        f"{sys.prefix}/bin/perf_analyzer",
        f"{temporary}/mini/config.json",
        "run from the checkout, {method 'reduce'}",
    ])  # fmt: skip
    assert portable_text(text).splitlines() == [
        "phoenix/stub/profile.py:70(save)",
        "site-packages/jax/_src/api.py:2035(device_put)",
        "<python>/functools.py:981(__get__)",
        "<venv>/bin/perf_analyzer",
        "<tmp>/mini/config.json",
        "run from the checkout, {method 'reduce'}",
    ]


def test_the_command_rewrites_files_in_place(tmp_path):
    log = tmp_path / "step.log"
    log.write_text(f"File {CHECKOUT}/bench/x.py, line 3\n")
    assert main([str(log)]) == 0
    assert log.read_text() == "File bench/x.py, line 3\n"


def test_results_show_paths_inside_the_checkout_relative_and_others_portably(tmp_path):
    assert shown_path(CHECKOUT / "artifacts" / "demo") == "artifacts/demo"
    assert shown_path(Path(tempfile.gettempdir()) / "rel" / "tiny") == "<tmp>/rel/tiny"
    assert shown_path("/usr/sbin/nginx") == "nginx"  # a program of the machine: its name
