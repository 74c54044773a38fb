"""The demo's end-to-end recommendation: one user through the ``recommend`` ensemble."""

from __future__ import annotations

import time
from pathlib import Path

from phoenix.checkpoint import load_config, load_example_sequence
from phoenix.serving.client import connect, feed_table, infer, recommend_inputs


def run_demo(http_url: str, artifacts_dir: str | Path, top_k: int = 50) -> None:
    """Recommend ``top_k`` posts for the artifact's example user and print the feed."""
    config = load_config(artifacts_dir)
    seq = load_example_sequence(artifacts_dir).to_dict()
    client = connect(http_url, "http")
    started = time.perf_counter()
    result = infer(client, "http", "recommend", recommend_inputs(seq, top_k))
    elapsed_ms = 1e3 * (time.perf_counter() - started)
    history = len(seq["history_post_ids"])
    print(
        f"\nRecommended feed for user {seq['user_id']} ({history} history items, "
        f"retrieve {top_k} then rank) in {elapsed_ms:.0f} ms over HTTP:\n"
    )
    print(feed_table(result, config.action_names, rows=20))
