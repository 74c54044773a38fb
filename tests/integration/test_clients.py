"""The command-line clients (clients/*.py) against a real tritonserver, over HTTP and gRPC.

Each client runs in-process through its main(); --check compares the server's answer with
the phoenix services run in the test process, so exit code 0 means the answers agree.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest

from clients import build_corpus
from phoenix.checkpoint import load_corpus, load_example_sequence
from phoenix.client.client import connect, infer, user_inputs
from phoenix.ops.admin_key import ADMIN_HEADER
from phoenix.util.processes import pick_free_ports
from tests.readme_samples import fenced_lines, readme_block, unmatched

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
PROTOCOLS = ["http", "grpc"]
REPO_ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "test-admin-key-0123456789"


def url_of(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def run_client(name: str, server, protocol: str, artifacts, *extra: str) -> int:
    module = importlib.import_module(f"clients.{name}")
    argv = ["--url", url_of(server, protocol), "--protocol", protocol]
    return module.main([*argv, "--artifacts", str(artifacts), *extra])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "name, extra",
    [
        ("recommend", ["--top-k", "30"]),
        ("rank", []),
        ("retrieve", ["--top-k", "20"]),
        ("encode_user", []),
    ],
)
def test_client_answer_matches_in_process(triton, tiny_artifacts, name, extra, protocol, capsys):
    code = run_client(name, triton, protocol, tiny_artifacts, *extra, "--check")
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "check passed" in out.out


@pytest.mark.parametrize(
    "name, protocol, extra",
    [
        ("recommend", "grpc", ["--history", "0"]),  # an empty history keeps its action width
        ("rank", "http", ["--candidates", "300"]),
        ("retrieve", "grpc", []),
    ],
)
def test_generated_users_match_in_process(triton, tiny_artifacts, name, protocol, extra, capsys):
    code = run_client(
        name, triton, protocol, tiny_artifacts, "--generate", "--seed", "4", *extra, "--check"
    )
    assert code == 0, capsys.readouterr().err


def test_feed_table_lists_ranked_posts(triton, tiny_artifacts, capsys):
    assert (
        run_client("recommend", triton, "http", tiny_artifacts, "--top-k", "12", "--rows", "5") == 0
    )
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank"))
    assert "post id" in lines[header] and "retrieval" in lines[header]
    assert [line.split()[0] for line in lines[header + 1 : header + 6]] == ["1", "2", "3", "4", "5"]
    assert lines[header + 6].startswith("... 7 more")


def test_check_reports_a_mismatch(triton, tiny_artifacts, tmp_path, capsys):
    """Other weights in the reference: --check exits 1 and names what differs."""
    from phoenix.artifacts import generate

    other = tmp_path / "other-weights"
    generate("tiny", other, seed=1, corpus_size=500)
    # the served artifacts' config (same digest: the client accepts them), other weights
    shutil.copy(tiny_artifacts / "config.json", other / "config.json")
    example = tiny_artifacts / "example_sequence.json"
    code = run_client("rank", triton, "http", other, "--input", str(example), "--check")
    err = capsys.readouterr().err
    assert code == 1
    assert "check FAILED" in err and "scores:" in err and "in-process" in err


def test_unreachable_server_is_a_clear_error(tiny_artifacts, capsys):
    code = build_corpus.main(
        ["--generate", "5", "--url", "127.0.0.1:9", "--artifacts", str(tiny_artifacts)]
    )
    assert code == 3
    assert "candidate_tower at 127.0.0.1:9" in capsys.readouterr().err


def make(*args: str, timeout: float = 540) -> subprocess.CompletedProcess:
    """`make ARGS` in the checkout, as a user types it (the set-up it depends on is done:
    `make test` did it), its output captured."""
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def test_demo_starts_its_own_server_prints_the_feed_and_stops_it(tiny_artifacts, tmp_path):
    """`make demo HTTP_PORT=.. GRPC_PORT=.. METRICS_PORT=.. DEMO_ARGS=--no-policy` (on the
    tiny artifacts): exit 0, the server on the ports asked for (and says so), the ranker's
    ranking beside the feed, and the tritonserver it started gone with it."""
    http, grpc, metrics = pick_free_ports(3)
    done = make(
        "demo", f"DEMO_ARTIFACTS={tiny_artifacts}", f"HTTP_PORT={http}", f"GRPC_PORT={grpc}",
        f"METRICS_PORT={metrics}", f"DEMO_ARGS=--no-policy --build-dir {tmp_path / 'build'}",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"  ports on 127.0.0.1: HTTP {http}, gRPC {grpc}, metrics {metrics} (make demo "
        "HTTP_PORT=N GRPC_PORT=N METRICS_PORT=N; no supervisor here)"
    ) in done.stdout.splitlines()
    assert "Recommended feed for user" in done.stdout
    assert re.search(r"the ranker alone \(no policy\) +after the feed policy", done.stdout)
    # the example user carries its own history: nothing is read, so nothing is in-network
    assert re.search(r"^  in-network: 0 of the top \d+ posts, 0% of the feed", done.stdout, re.M)
    server_pid = int(re.search(r"^tritonserver (\d+) ready after", done.stdout, re.M)[1])
    assert not psutil.pid_exists(server_pid)
    assert (tmp_path / "build" / "admin-key").stat().st_mode & 0o777 == 0o600


@pytest.fixture(scope="module")
def make_demo(trained_demo, tmp_path_factory) -> str:
    """What `make demo` printed (one run for the tests below: a run serves the trained demo
    and loads its world's users into a redis-server of its own), its log and admin key in a
    folder of the test's own."""
    build = tmp_path_factory.mktemp("make-demo") / "build"
    done = make("demo", f"DEMO_ARGS=--build-dir {build}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "-m clients.demo --artifacts artifacts/trained-demo " in done.stdout  # make's echo
    return done.stdout


def test_the_trained_demo_diversifies_its_top_10(make_demo):
    """`make demo` on the towers shipped in artifacts/trained-demo, through a real server: the
    ranker alone gives one author 5 of the top 10, the feed policy's defaults leave no author
    more than 2, and the demo prints both counts."""
    counts = dict(re.findall(r"^  (.+): at most (\d+) of the top 10 posts", make_demo, re.M))
    assert int(counts["ranker alone"]) == 5, make_demo  # the shipped towers' @sports_10
    assert int(counts["after the feed policy"]) <= 2, make_demo
    # the by-id part: the world's users in a redis-server of its own, the feed by id from the
    # stored history (the example user's 16 items), then after an engagement and a post event
    assert re.search(r"^2,001 users loaded into the user-state store", make_demo, re.M)
    assert "BY ID (recommend with user_id and top_k only; the server read 16 history" in make_demo
    assert re.search(r"After an engagement event: .* favourited 3 \w+ posts", make_demo)
    assert re.search(r"^  the new post is (at rank \d+|not in the feed)$", make_demo, re.M)
    # the new post is named by its author, in no metadata as it is
    author = re.search(r"^After a post event: (@\w+), whom user", make_demo, re.M)[1]
    marked = re.search(r"^ +\d+  (\S+) +(\S+) +\d+  <- the new post$", make_demo, re.M)
    assert marked is not None and marked[2] == author and marked[1] != "?", make_demo
    # the free ports it picked, said
    assert re.search(r"^  ports on 127.0.0.1: HTTP \d+ \(free\), gRPC \d+ \(free\), metrics "
                     r"\d+ \(free\)", make_demo, re.M)  # fmt: skip


def test_the_readme_shows_what_make_demo_prints(make_demo):
    """Every line of the README's `make demo` sample is in what `make demo`'s command prints,
    in order (numbers aside: timings and scores vary by machine)."""
    sample = fenced_lines(readme_block("demo-output"))
    output = make_demo.splitlines()
    missing = unmatched(sample, output)
    assert missing is None, f"the README shows\n{missing}\n\n`make demo` printed\n{make_demo}"
    # the comparison can fail: the same output does not show a header it lacks
    header = next(i for i, line in enumerate(sample) if line.startswith("rank"))
    altered = [*sample[:header], sample[header].replace("score", "scores"), *sample[header + 1 :]]
    assert unmatched(altered, output) is not None


# -- build_corpus: input formats -----------------------------------------------------------


def test_posts_files_in_every_format(tmp_path):
    table = np.array([[11, 5, 1], [12, 6, 2], [13, 5, 3]], np.int64)
    (tmp_path / "with_header.csv").write_text(
        "author_id,post_id,topic\n" + "".join(f"{a},{p},{t}\n" for p, a, t in table)
    )
    (tmp_path / "plain.csv").write_text("".join(f"{p},{a}\n" for p, a, _ in table))
    np.save(tmp_path / "posts.npy", table)
    np.savez(tmp_path / "posts.npz", post_ids=table[:, 0], author_ids=table[:, 1])
    for name in ("with_header.csv", "plain.csv", "posts.npy", "posts.npz"):
        posts = build_corpus.read_posts(tmp_path / name)
        assert posts.post_ids.tolist() == [11, 12, 13], name
        assert posts.author_ids.tolist() == [5, 6, 5], name
    assert build_corpus.read_posts(tmp_path / "with_header.csv").topics.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "text, message",
    [("1,2\n1,3\n", "duplicate post ids"), ("0,2\n", "must be > 0"), ("x,2\n", "int64")],
)
def test_bad_posts_files_are_refused(tmp_path, text, message):
    path = tmp_path / "posts.csv"
    path.write_text(text)
    with pytest.raises(build_corpus.InputFileError, match=message):
        build_corpus.read_posts(path)


# -- build_corpus + reload, on a server of the test's own ----------------------------------


def retrieved_ids(server, example: dict, top_k: int = 40) -> np.ndarray:
    client = connect(server.http_url, "http")
    users = user_inputs(example)
    embedding = infer(client, "http", "user_encoder", users)["user_embedding"]
    arrays = {
        "user_embedding": embedding,
        "top_k": np.array([[top_k]], np.int32),
        "history_post_ids": users["history_post_ids"],
    }
    return infer(client, "http", "retriever", arrays)["post_ids"][0]


def test_build_corpus_reload_switches_the_retriever(
    tiny_artifacts, tmp_path, start_server, monkeypatch, capsys
):
    """With an admin key on the load API, as `serve` runs it when PHOENIX_ADMIN_KEY is set."""
    artifacts = tmp_path / "artifacts"  # the corpus is written here: keep the shared dir intact
    shutil.copytree(tiny_artifacts, artifacts)
    restriction = f"model-repository:{ADMIN_HEADER}={ADMIN_KEY}"
    server = start_server(
        REPO_ROOT / "model_repository",
        artifacts,
        model_control_mode="explicit",
        load_model=["user_encoder", "candidate_tower", "retriever"],
        http_restricted_api=restriction,
        grpc_restricted_protocol=restriction,
        exit_timeout_secs=5,
    )
    example = load_example_sequence(artifacts).to_dict()
    old = set(load_corpus(artifacts).post_ids.tolist())
    assert set(retrieved_ids(server, example).tolist()) <= old

    authors = load_corpus(artifacts).author_ids
    new_ids = np.arange(10_001, 10_151)
    posts = tmp_path / "new_posts.csv"
    posts.write_text(
        "post_id,author_id\n" + "".join(f"{p},{a}\n" for p, a in zip(new_ids, authors))
    )
    argv = [
        str(posts),
        "--url",
        server.grpc_url,
        "--protocol",
        "grpc",
        "--artifacts",
        str(artifacts),
    ]
    monkeypatch.delenv("PHOENIX_ADMIN_KEY", raising=False)
    assert build_corpus.main([*argv, "--reload"]) == 3  # no key: refused, nothing changes
    assert "PHOENIX_ADMIN_KEY" in capsys.readouterr().err
    assert set(retrieved_ids(server, example).tolist()) <= old

    monkeypatch.setenv("PHOENIX_ADMIN_KEY", ADMIN_KEY)
    assert build_corpus.main([*argv, "--batch-size", "64", "--check", "--reload"]) == 0
    out = capsys.readouterr().out
    assert "check passed" in out and "now serves corpus-new_posts.npz" in out
    assert (artifacts / "corpus-new_posts.npz").is_file()

    assert set(retrieved_ids(server, example).tolist()) <= set(new_ids.tolist())
    assert run_client("retrieve", server, "http", artifacts, "--top-k", "25", "--check") == 0


def test_reload_on_a_server_without_the_load_api_is_refused(
    triton, tiny_artifacts, tmp_path, capsys
):
    """The shared server runs without explicit model control: a clear error, nothing changes."""
    artifacts = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, artifacts)
    argv = ["--generate", "20", "--url", triton.http_url, "--artifacts", str(artifacts), "--reload"]
    assert build_corpus.main(argv) == 3
    assert "--model-control-mode=explicit" in capsys.readouterr().err
    config = connect(triton.http_url, "http").get_model_config("retriever")
    assert config["parameters"]["corpus_file"]["string_value"] == "corpus.npz"
