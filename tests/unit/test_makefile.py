"""The Makefile's serve, demo and train rules, read with `make -n` (nothing runs)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from phoenix.ops import serve

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def dry_run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO_ROOT), *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    "variables",
    [
        [],
        ["ARTIFACTS=artifacts/trained-demo"],  # the demo's directory, served by `make serve`
        ["ARTIFACTS=./artifacts/trained-demo/"],  # the same directory, spelt otherwise
        ["TRAINED=artifacts/trained-demo", "TRAIN_PRESET=demo"],
        ["ARTIFACTS=artifacts/demo", "DEMO_ARTIFACTS=artifacts/demo"],
    ],
)
def test_one_directory_in_several_roles_gets_one_rule(variables):
    """Two rules for one config.json make make print `warning: overriding recipe`."""
    done = dry_run("serve", "demo", "train", *variables)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr


def test_serve_passes_every_port_on_so_two_servers_can_run_side_by_side():
    ports = dict(HTTP_PORT="9100", GRPC_PORT="9101", METRICS_PORT="9102", SUPERVISOR_PORT="9103")
    done = dry_run("serve", *(f"{k}={v}" for k, v in ports.items()))
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if "-m phoenix.ops.serve" in ln)
    words = shlex.split(line)
    args = serve.build_parser().parse_args(words[words.index("phoenix.ops.serve") + 1 :])
    served = (args.http_port, args.grpc_port, args.metrics_port, args.supervisor_port)
    assert served == (9100, 9101, 9102, 9103)


def test_help_says_the_demo_serves_the_shipped_towers():
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO_ROOT), "help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    demo = next(ln for ln in done.stdout.splitlines() if ln.strip().startswith("demo "))
    assert "shipped" in demo and "train" not in demo.replace("trained", "")
    assert "SUPERVISOR_PORT=8003" in done.stdout


def serve_args(*variables: str, env: dict[str, str] | None = None) -> argparse.Namespace:
    """serve's arguments as `make serve` with ``variables`` passes them (nothing runs), checked
    as serve checks them; ``env``: more environment ($PHOENIX_USER_STATE_URL is left out)."""
    skipped = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PHOENIX_USER_STATE_URL")
    environ = {k: v for k, v in os.environ.items() if k not in skipped} | (env or {})
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO_ROOT), "serve", *variables],
        capture_output=True, text=True, timeout=60, env=environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if "-m phoenix.ops.serve" in ln)
    words = shlex.split(line)
    parser = serve.build_parser()
    args = parser.parse_args(words[words.index("phoenix.ops.serve") + 1 :])
    serve.check_store_arguments(parser, args)
    return args


def test_serve_keeps_the_store_in_store_dir_or_names_another_or_a_throwaway_one(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("PHOENIX_USER_STATE_URL", raising=False)
    kept = serve_args()
    assert (kept.store_dir, kept.store_port) == (Path("build/serve/user-state"), 8004)
    assert kept.redis is None and not kept.ephemeral_store
    moved = serve_args(f"STORE_DIR={tmp_path}/my store", "STORE_PORT=9104")
    assert (moved.store_dir, moved.store_port) == (tmp_path / "my store", 9104)
    named = serve_args("REDIS=redis://10.0.0.5:6379/0")
    assert named.redis == "redis://10.0.0.5:6379/0" and named.store_dir is None
    monkeypatch.setenv("PHOENIX_USER_STATE_URL", "redis+cluster://r:7000")  # serve reads it
    from_env = serve_args(env={"PHOENIX_USER_STATE_URL": "redis+cluster://r:7000"})
    assert from_env.redis == "redis+cluster://r:7000" and from_env.store_port is None
    monkeypatch.delenv("PHOENIX_USER_STATE_URL")
    throwaway = serve_args("STORE_DIR=")
    assert throwaway.ephemeral_store and throwaway.store_dir is None
    assert serve_args("SERVE_ARGS=--store-fsync always").store_fsync == "always"


def test_help_names_the_store_variables():
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO_ROOT), "help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    for variable in ("STORE_DIR=build/serve/user-state", "STORE_PORT=8004", "REDIS=URL"):
        assert variable in done.stdout, done.stdout


def planned_args(target: str, module: str, *variables: str, env: dict | None = None) -> list[str]:
    """The arguments `make TARGET VARIABLES` gives ``module`` (read with `make -n`)."""
    done = dry_run(target, *variables) if env is None else dry_run_env(env, target, *variables)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.replace("\\\n", " ").splitlines()  # a recipe's continued lines joined
    words = shlex.split(next(line for line in lines if module in line))
    return words[words.index(module) + 1 :]


def dry_run_env(env: dict, *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO_ROOT), *args],
        capture_output=True, text=True, timeout=60, env=base | env,
    )  # fmt: skip


def test_serve_serves_the_trained_demo_towers_the_readme_calls_unless_artifacts_names_others():
    def served(*variables: str, env: dict | None = None) -> Path:
        words = planned_args("serve", "phoenix.ops.serve", *variables, env=env)
        return serve.build_parser().parse_args(words).artifacts

    assert served() == Path("artifacts/trained-demo")
    assert served("ARTIFACTS=artifacts/demo") == Path("artifacts/demo")
    assert served(env={"ARTIFACTS": "artifacts/demo"}) == Path("artifacts/demo")


def test_demo_takes_the_ports_given_and_picks_free_ones_for_the_others():
    from clients import demo

    def ports(*variables: str) -> tuple[int, int, int]:
        args = demo.parse_args(planned_args("demo", "clients.demo", *variables))
        return args.http_port, args.grpc_port, args.metrics_port

    assert ports() == (0, 0, 0)  # free ones: it runs beside `make serve`
    assert ports("HTTP_PORT=9100", "METRICS_PORT=9102") == (9100, 0, 9102)
    assert ports("HTTP_PORT=9100", "GRPC_PORT=9101", "METRICS_PORT=9102") == (9100, 9101, 9102)


def test_loadtest_of_a_running_server_assumes_what_make_serve_serves():
    def artifacts(*variables: str) -> str:
        words = planned_args("loadtest", "loadtest/locustfile.py", *variables)
        return words[words.index("--artifacts") + 1]

    assert artifacts() == "artifacts/demo"  # its own server: the benchmarks' artifacts
    assert artifacts("HTTP_PORT=8000") == "artifacts/trained-demo"  # make serve's
    assert artifacts("HTTP_PORT=8000", "ARTIFACTS=artifacts/demo") == "artifacts/demo"
