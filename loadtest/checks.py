"""The checks of the load test's answers: each returns None when an answer is right, else what
is wrong with it (a failed check is a failed request in Locust's tables)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Optional

import numpy as np

from phoenix.schema.served import contract
from phoenix.user_state import UserStateLimits

NORM_TOLERANCE = 1e-3

Check = Callable[[Mapping[str, np.ndarray]], Optional[str]]


def shape_problem(
    model: str, outputs: Mapping[str, np.ndarray], shapes: Mapping[str, tuple]
) -> Optional[str]:
    """Every output of the model's contract is there (its optional ones where the artifacts
    answer them); those in ``shapes`` have that shape."""
    for spec in contract(model).outputs:
        if not spec.optional and outputs.get(spec.name) is None:
            return f"output {spec.name} missing"
    for name, shape in shapes.items():
        if tuple(outputs[name].shape) != shape:
            return f"output {name} has shape {outputs[name].shape}, expected {shape}"
    return None


def sorted_problem(scores: np.ndarray, name: str) -> Optional[str]:
    if not np.all(np.isfinite(scores)):
        return f"{name} has non-finite values"
    if np.any(np.diff(scores) > 0):
        return f"{name} not sorted descending"
    return None


def check_ranking(candidates: np.ndarray, num_actions: int) -> Check:
    count = len(candidates)

    def check(out):
        shapes = {
            "ranked_post_ids": (1, count),
            "scores": (1, count),
            "action_probs": (1, count, num_actions),
        }
        problem = shape_problem("ranker", out, shapes) or sorted_problem(out["scores"][0], "scores")
        if problem:
            return problem
        if not np.array_equal(np.sort(out["ranked_post_ids"][0]), np.sort(candidates)):
            return "ranked_post_ids are not the candidates"
        probs = out["action_probs"]
        if not (np.all(probs >= 0) and np.all(probs <= 1)):
            return "action_probs outside [0, 1]"
        return None

    return check


def check_retrieved(
    model: str, count: int, history: np.ndarray, ids: str, scores: str, extra: Sequence[str] = ()
) -> Check:
    """`count` unique posts, none from the history, scores sorted descending."""

    def check(out):
        shapes = {name: (1, count) for name in (ids, scores, *extra)}
        problem = shape_problem(model, out, shapes)
        problem = problem or sorted_problem(out[scores][0], scores)
        if problem:
            return problem
        posts = out[ids][0]
        if len(np.unique(posts)) != count:
            return f"{ids} has duplicates"
        if np.isin(posts, history).any():
            return f"{ids} contains posts of the user's history"
        return None

    return check


def check_filtered(
    count: int, history: np.ndarray, seen: np.ndarray, excluded: np.ndarray
) -> Check:
    """A feed with filters: at most `count` unique posts, sorted, none from the history, the
    seen posts or the excluded authors."""

    def check(out):
        problem = shape_problem("recommend", out, {})
        posts, authors = out["ranked_post_ids"][0], out["ranked_author_ids"][0]
        problem = problem or sorted_problem(out["scores"][0], "scores")
        if problem:
            return problem
        if len(posts) > count or len(np.unique(posts)) != len(posts):
            return f"ranked_post_ids: {len(posts)} posts, at most {count} unique expected"
        if np.isin(posts, history).any() or np.isin(posts, seen).any():
            return "ranked_post_ids contains posts of the history or seen posts"
        if np.isin(authors, excluded).any():
            return "ranked_author_ids contains an excluded author"
        return None

    return check


def check_by_id(top_k: int, seen: np.ndarray, excluded: np.ndarray) -> Check:
    """A feed by user id: up to top_k retrieved plus the in-network posts, unique, sorted,
    every per-post output as long, in_network flags 0 or 1, a request id > 0, none of the seen
    posts or excluded authors. An empty feed is allowed: a hot user served the whole corpus
    within the served-posts TTL has nothing left but in-network posts, maybe none."""
    most = top_k + UserStateLimits().in_network_total

    def check(out):
        problem = shape_problem("recommend", out, {})
        if problem:
            return problem
        count = out["ranked_post_ids"].shape[-1]
        shapes = {"ranked_post_ids": (1, count), "request_id": (1, 1)}
        shapes.update({name: (1, count) for name in ("scores", "ranked_author_ids", "in_network")})
        problem = shape_problem("recommend", out, shapes)
        problem = problem or sorted_problem(out["scores"][0], "scores")
        if problem:
            return problem
        posts, authors = out["ranked_post_ids"][0], out["ranked_author_ids"][0]
        if count > most or len(np.unique(posts)) != count:
            return f"ranked_post_ids: {count} posts, at most {most} unique expected"
        if not np.isin(out["in_network"][0], (0, 1)).all():
            return "in_network has flags other than 0 and 1"
        if out["request_id"][0, 0] <= 0:
            return f"request_id {out['request_id'][0, 0]} is not positive"
        if np.isin(posts, seen).any() or np.isin(authors, excluded).any():
            return "ranked_post_ids contains seen posts or posts of excluded authors"
        return None

    return check


def check_user_embedding(emb_size: int) -> Check:
    def check(out):
        problem = shape_problem("user_encoder", out, {"user_embedding": (1, emb_size)})
        if problem:
            return problem
        norm = float(np.linalg.norm(out["user_embedding"][0]))
        if not abs(norm - 1.0) < NORM_TOLERANCE:
            return f"user_embedding has L2 norm {norm:.4f}, expected 1"
        return None

    return check
