"""The ranked-feed tables the clients print: a retrieval column only where scores were sent."""

import numpy as np

from clients import rank
from phoenix.client.client import feed_table

ACTIONS = ["like", "reply", "repost"]


def ranker_answer(retrieval: list[float]) -> dict[str, np.ndarray]:
    return {
        "ranked_post_ids": np.array([[30, 10, 20]], np.int64),
        "ranked_author_ids": np.array([[3, 1, 2]], np.int64),
        "scores": np.array([[0.9, 0.5, 0.25]], np.float32),
        "action_probs": np.array([[[0.7, 0.2, 0.1]] * 3], np.float32),
        "ranked_retrieval_scores": np.array([retrieval], np.float32),
    }


def request(with_retrieval: bool) -> dict[str, np.ndarray]:
    arrays = {"candidate_post_ids": np.array([[10, 20, 30]], np.int64)}
    if with_retrieval:
        arrays["candidate_retrieval_scores"] = np.array([[0.4, 0.3, 0.8]], np.float32)
    return arrays


def test_rank_without_retrieval_scores_prints_no_retrieval_column():
    served = ranker_answer([0.0, 0.0, 0.0])  # what the ranker answers when none were sent
    lines = feed_table(rank.shown_result(request(False), served), ACTIONS).splitlines()
    assert lines[0].split() == ["rank", "post", "id", "score", "top", "actions"]
    assert lines[1].split() == [
        "1",
        "30",
        "0.900",
        "like",
        "0.70,",
        "reply",
        "0.20,",
        "repost",
        "0.10",
    ]
    assert all("0.000" not in line for line in lines)


def test_rank_with_retrieval_scores_prints_them():
    served = ranker_answer([0.8, 0.4, 0.3])
    lines = feed_table(rank.shown_result(request(True), served), ACTIONS).splitlines()
    assert lines[0].split() == ["rank", "post", "id", "score", "retrieval", "top", "actions"]
    assert lines[1].split()[:4] == ["1", "30", "0.900", "0.800"]
    assert [line.split()[3] for line in lines[1:]] == ["0.800", "0.400", "0.300"]


def test_the_retrieval_column_lines_up_with_its_header():
    lines = feed_table(ranker_answer([0.8, 0.4, 0.3]), ACTIONS).splitlines()
    end = lines[0].index("retrieval") + len("retrieval")
    assert all(line[:end].endswith(("0.800", "0.400", "0.300")) for line in lines[1:])
