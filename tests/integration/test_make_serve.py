"""`make serve` as a user types it, and the commands the docs run against it, each as typed.

One `make serve` (its four port variables set to free ports, everything else its defaults:
the trained demo towers, a local redis-server, build/serve for its state and admin key) for
the module. Against it, with its ports put in for the docs' 8000-8003 (and `--url` where a
client takes the docs' default port): the README's call example as a script, the curl probes
of docs/serving.md and docs/deploy.md, the feed-policy commands of docs/policy.md, and the
corpus reload by hand of docs/reliability.md. The venv's bin folder comes first on PATH, as
for a user whose venv is active (`python`, `phoenix-*`).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.polling import wait_until
from tests.readme_samples import fenced_lines, readme_block

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCS = REPO_ROOT / "docs"
READY_TIMEOUT_S = 600  # serve's own patience for the models (its programs are compiled)


@dataclass
class Served:
    http: int
    grpc: int
    metrics: int
    supervisor: int
    log: Path

    def typed(self, command: str) -> str:
        """The docs' command with this server's ports for 8000-8003."""
        for doc_port, port in ((8000, self.http), (8001, self.grpc), (8002, self.metrics),
                               (8003, self.supervisor)):  # fmt: skip
            command = re.sub(rf"(?<=:){doc_port}\b", str(port), command)
        return command


def environment() -> dict[str, str]:
    # a user's environment: the suite's first-use program loading left out (the default here)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PHOENIX_ADMIN_KEY",
                        "PHOENIX_PROGRAM_LOADING")}  # fmt: skip
    return env | {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}


def shell(command: str, cwd: Path = REPO_ROOT, timeout: float = 120) -> str:
    """A command line of the docs, run by bash as typed; its output (exit 0 asserted)."""
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=environment(),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def doc_block(path: Path, containing: str) -> str:
    """The first fenced block of ``path`` that holds ``containing``."""
    blocks = re.findall(r"^```[\w-]*\n(.*?)^```", path.read_text(), re.M | re.S)
    return next(block for block in blocks if containing in block)


@pytest.fixture(scope="module")
def served(trained_demo, tmp_path_factory):
    from phoenix.util.processes import pick_free_ports

    http, grpc, metrics, supervisor = pick_free_ports(4)
    log = tmp_path_factory.mktemp("make-serve") / "make-serve.log"
    ports = [f"HTTP_PORT={http}", f"GRPC_PORT={grpc}", f"METRICS_PORT={metrics}",
             f"SUPERVISOR_PORT={supervisor}"]  # fmt: skip
    with log.open("wb") as output:
        make = subprocess.Popen(["make", "--no-print-directory", "serve", *ports], cwd=REPO_ROOT,
                                env=environment(), stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    server = Served(http, grpc, metrics, supervisor, log)
    try:
        up = wait_until(lambda: make.poll() is not None or ready(
            f"http://127.0.0.1:{supervisor}/ready"), READY_TIMEOUT_S, 0.5)  # fmt: skip
        assert up is not None and make.poll() is None, log.read_text()[-5000:]
        yield server
    finally:
        os.killpg(make.pid, signal.SIGTERM)  # as Ctrl-C: make and serve, which stops the rest
        try:
            make.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(10)


def test_make_serve_serves_the_trained_demo_towers_on_the_ports_given(served):
    text = served.log.read_text()
    assert "-m phoenix.ops.serve --artifacts artifacts/trained-demo " in text  # make's echo
    assert f"  HTTP     http://127.0.0.1:{served.http}" in text
    assert f"  ready    http://127.0.0.1:{served.supervisor}/ready" in text
    status = json.loads(shell(served.typed("curl -s localhost:8003/ready")))  # docs/deploy.md
    assert status["ready"] is True, status


def test_the_readmes_call_example_runs_as_a_script(served, tmp_path):
    """The README's tritonclient call, saved as a file and run: user 42 (unknown to the empty
    store: a cold-start feed) gets ten posts and a request id."""
    code = "\n".join(fenced_lines(readme_block("call-example")))
    script = tmp_path / "call.py"
    script.write_text(served.typed(code))
    out = shell(f"python {script}")
    posts, scores = re.findall(r"\[([^\]]*)\]", out)  # numpy wraps long arrays over lines
    assert len(posts.split()) == len(scores.split()) == 10, out
    assert all(word.isdigit() for word in posts.split()), out
    assert re.search(r"^request id \d+$", out, re.M), out


def test_the_curl_probes_of_the_serving_guide(served):
    """docs/serving.md's `curl -s 127.0.0.1:8000/v2/health/ready ...`, `curl -s
    127.0.0.1:8000/v2/models/<model>/config` (the ranker's) and `curl -s
    127.0.0.1:8002/metrics | grep ...`, and docs/deploy.md's recommend config piped to head."""
    block = doc_block(DOCS / "serving.md", "/v2/health/ready")
    health, config = [line.split("#")[0].strip() for line in block.splitlines()]
    assert shell(served.typed(health)) == "200\n"
    ranker = json.loads(shell(served.typed(config.replace("<model>", "ranker"))))
    assert ranker["name"] == "ranker"
    metrics = shell(served.typed(doc_block(DOCS / "serving.md", "/metrics").strip()))
    names = {line.split("{")[0].split()[0] for line in metrics.splitlines()}
    assert "nv_inference_request_success" in names and any(n.startswith("phoenix_") for n in names)
    head = shell(served.typed("curl -s localhost:8000/v2/models/recommend/config | head"))
    assert '"name":"recommend"' in head.replace(" ", "")  # docs/deploy.md


def test_the_feed_policy_commands_show_and_change_the_running_parameters(served):
    """docs/policy.md's three commands, in order (the admin key found in build/serve, where
    make serve put it), then the defaults back."""
    block = doc_block(DOCS / "policy.md", "clients.feed_policy")
    lines = [line.split("#")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    url = f"--url 127.0.0.1:{served.http}"
    show, set_diversity, weights = (f"{line} {url}" for line in lines if line)
    before = shell(show)
    assert "author_diversity_decay" in before, before
    shell(set_diversity)
    assert re.search(r"author_diversity_decay\W+0\.7\b", shell(show)), shell(show)
    shell(weights)
    after = shell(show)
    assert re.search(r"report\W+-200\b", after) and re.search(r"reply\W+20\b", after), after


def test_the_corpus_reload_by_hand_keeps_serving(served, tmp_path):
    """docs/reliability.md's reload of the retriever by hand (its config as it is): `curl -s
    localhost:8000/v2/models/retriever/config > cfg.json`, then the `python - <<'EOF'` script
    as written prints 200, and the server stays ready."""
    block = doc_block(DOCS / "reliability.md", "repository/models/retriever/load")
    key = tmp_path / "build" / "serve"
    key.mkdir(parents=True)
    (key / "admin-key").symlink_to(REPO_ROOT / "build" / "serve" / "admin-key")
    lines = block.splitlines()
    fetch = lines[0].split("#")[0].strip()
    shell(served.typed(fetch), cwd=tmp_path)
    assert json.loads((tmp_path / "cfg.json").read_text())["name"] == "retriever"
    out = shell(served.typed("\n".join(lines[1:])), cwd=tmp_path, timeout=300)
    assert out.strip() == "200", out
    assert ready(f"http://127.0.0.1:{served.supervisor}/ready")


def test_plain_locust_on_the_locustfile(served, tmp_path):
    """loadtest/README.md's plain Locust command, headless for 6 s instead of its web UI, with
    the artifacts make serve serves: every request answered, the by-id ones too (the docs'
    server has a store: make serve's; the world's users unknown to it get cold-start feeds)."""
    command = served.typed(
        "locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --grpc-url 127.0.0.1:8001 "
        f"--artifacts artifacts/trained-demo --headless -u 2 -r 2 -t 6s --csv {tmp_path / 'plain'}"
    )
    shell(command, timeout=240)
    with (tmp_path / "plain_stats.csv").open(newline="") as handle:
        rows = {row["Name"]: row for row in csv.DictReader(handle)}
    assert int(rows["Aggregated"]["Request Count"]) > 0, rows
    assert int(rows["Aggregated"]["Failure Count"]) == 0, rows
