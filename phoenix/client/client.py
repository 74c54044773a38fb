"""Client-side helpers shared by clients/, the demo, the load tests, the benchmarks and the tests.

Builds request tensors from an ``example_sequence.json``-style dict as each model's contract
(``phoenix.schema.contracts``) says, turns arrays into tritonclient ``InferInput``s (the one
place that does), sends them over HTTP or gRPC, and formats a ranked feed as a table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from phoenix.schema.contracts import POLICY_FILTERS
from phoenix.schema.served import contract
from phoenix.schema.spec import TensorSpec


def client_module(protocol: str):
    """``tritonclient.http`` or ``tritonclient.grpc``."""
    if protocol == "http":
        import tritonclient.http as module
    elif protocol == "grpc":
        import tritonclient.grpc as module
    else:
        raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
    return module


def connect(url: str, protocol: str = "http", **kwargs):
    """An InferenceServerClient for ``url`` (host:port, no scheme; kwargs: its options)."""
    url = url.split("://", 1)[-1]
    return client_module(protocol).InferenceServerClient(url=url, **kwargs)


def input_row(spec: TensorSpec, value: Any, num_actions: Optional[int] = None) -> np.ndarray:
    """One request row of an input: ``value`` in the contract's dtype, batch dimension first.

    An empty JSON history (``"history_actions": []``) has no action width: pass
    ``num_actions`` (the artifact config's) to send a [1, 0, A] tensor. A fixed inner axis
    (the 6 semantic-ID levels) needs nothing.
    """
    array = np.asarray(value, spec.dtype)
    if spec.dims == (1,):  # one value per row: user_id, top_k
        return array.reshape(1, 1)
    if array.ndim < len(spec.dims):  # an empty list has lost its inner axes
        inner = [axis if isinstance(axis, int) else None for axis in spec.axes[1:]]
        if None in inner and num_actions is None:
            raise ValueError(f"empty {spec.name}: pass num_actions to size the tensor")
        sizes = [int(num_actions or 0) if axis is None else axis for axis in inner]
        return np.zeros((1, 0, *sizes), spec.dtype)
    return array[None]


def model_inputs(
    model: str, values: Mapping[str, Any], num_actions: Optional[int] = None
) -> dict[str, np.ndarray]:
    """One request (batch dimension 1) for ``model`` from a dict named like its inputs.

    Keys that are no input of the model are ignored; optional inputs that are absent or None
    are left out; a missing required input raises KeyError.
    """
    arrays = {}
    for spec in contract(model).inputs:
        value = values.get(spec.name)
        if value is None:
            if spec.optional:
                continue
            raise KeyError(f"{model} needs the input {spec.name!r}")
        arrays[spec.name] = input_row(spec, value, num_actions)
    return arrays


def user_inputs(seq: Mapping[str, Any], num_actions: Optional[int] = None) -> dict[str, np.ndarray]:
    """One user's history: the user_encoder's request."""
    return model_inputs("user_encoder", seq, num_actions)


def ranker_inputs(
    seq: Mapping[str, Any], num_actions: Optional[int] = None
) -> dict[str, np.ndarray]:
    """One user with candidates (and the optional inputs ``seq`` has): the ranker's request."""
    return model_inputs("ranker", seq, num_actions)


def recommend_inputs(
    seq: Mapping[str, Any], top_k: Optional[int] = None, num_actions: Optional[int] = None
) -> dict[str, np.ndarray]:
    """One user and ``top_k`` (default: the sequence's, else 50): the recommend request."""
    values = {**seq, "top_k": int(top_k or seq.get("top_k", 50))}
    return model_inputs("recommend", values, num_actions)


def infer_inputs(module, arrays: Mapping[str, np.ndarray]) -> list:
    """tritonclient InferInputs (of ``module``, http or grpc) holding ``arrays`` as they are.

    The wire datatype is the array's own (``np_to_triton_dtype``): the arrays are sent
    unconverted, so a wrong dtype reaches the server and gets its INVALID_ARG.
    """
    tensors = []
    for name, array in arrays.items():
        array = np.require(array, requirements="C")  # unlike ascontiguousarray, keeps 0-d
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def infer(
    client,
    protocol: str,
    model: str,
    arrays: Mapping[str, np.ndarray],
    outputs: Optional[Sequence[str]] = None,
    **kwargs,
) -> dict[str, np.ndarray]:
    """Run one inference; returns the requested (or all) outputs as numpy arrays."""
    module = client_module(protocol)
    requested = None
    if outputs is not None:
        requested = [module.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, infer_inputs(module, arrays), outputs=requested, **kwargs)
    return result_arrays(result, outputs)


def served_models(client, protocol: str):
    """``run_model(model, requests) -> outputs`` over a server, one inference per request (for
    ``wiring.run_until``: the ranking before the feed policy, step by step)."""

    def run_model(model: str, requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict]:
        return [infer(client, protocol, model, request) for request in requests]

    return run_model


def result_arrays(result, names: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
    """The outputs of an InferResult (either protocol) by name; all of them without ``names``."""
    if names is None:
        response = result.get_response()
        names = (
            [o["name"] for o in response["outputs"]]
            if isinstance(response, dict)
            else [o.name for o in response.outputs]
        )
    return {name: result.as_numpy(name) for name in names}


class FeedRow(NamedTuple):
    """One ranked post of a feed, as the feed tables print it."""

    rank: int
    post_id: int
    score: float
    retrieval_score: float  # NaN when the result carries none
    top_actions: str  # "name prob, ..." of the most likely actions


def feed_rows(
    result: Mapping[str, np.ndarray], action_names: Sequence[str], rows: int, top_actions: int = 3
) -> list[FeedRow]:
    """The first ``rows`` posts of the first user of a ranked result."""
    posts = result["ranked_post_ids"][0]
    scores = result["scores"][0]
    retrieval = retrieval_scores(result)
    retrieval = retrieval[0] if retrieval is not None else np.full(len(posts), np.nan)
    probs = result["action_probs"][0]
    out = []
    for i in range(min(rows, len(posts))):
        best = np.argsort(-probs[i])[:top_actions]
        actions = ", ".join(f"{action_names[a]} {probs[i, a]:.2f}" for a in best)
        out.append(FeedRow(i + 1, int(posts[i]), scores[i], retrieval[i], actions))
    return out


def more_line(result: Mapping[str, np.ndarray], rows: int) -> list[str]:
    """ "... N more" when the feed is longer than the table."""
    count = len(result["ranked_post_ids"][0])
    return [f"... {count - rows} more"] if count > rows else []


def empty_feed_line(result: Mapping[str, np.ndarray]) -> list[str]:
    """Why the first user's feed is empty, from the policy's ``filtered_counts`` (when the
    result has them): "no posts: all N candidates filtered (too_old N)"."""
    counts = result.get("filtered_counts")
    if counts is None or (result["ranked_post_ids"][0] != 0).any():  # 0: a padded row's end
        return []
    counts = counts[0]
    if counts.sum() == 0:
        return ["no posts: no candidates to filter"]
    why = ", ".join(f"{name} {n}" for name, n in zip(POLICY_FILTERS, counts.tolist()) if n)
    return [f"no posts: all {counts.sum()} candidates filtered ({why})"]


def feed_table(
    result: Mapping[str, np.ndarray],
    action_names: Sequence[str],
    rows: int = 20,
    top_actions: int = 3,
) -> str:
    """A ranked feed as text: rank, post id, blended score, retrieval score (only when the
    result carries retrieval scores), top actions."""
    shows_retrieval = has_retrieval_scores(result)
    retrieval_header = f"{'retrieval':>9}  " if shows_retrieval else ""
    lines = [f"{'rank':>4}  {'post id':>20}  {'score':>8}  {retrieval_header}top actions"]
    for r in feed_rows(result, action_names, rows, top_actions):
        retrieval = f"{r.retrieval_score:>9.3f}  " if shows_retrieval else ""
        lines.append(f"{r.rank:>4}  {r.post_id:>20}  {r.score:>8.3f}  {retrieval}{r.top_actions}")
    return "\n".join(lines + more_line(result, rows) + empty_feed_line(result))


# What a ranked result calls its retrieval scores: recommend's name, the ranker's and the policy's.
RETRIEVAL_SCORE_NAMES = ("retrieval_scores", "ranked_retrieval_scores")


def retrieval_scores(result: Mapping[str, np.ndarray]) -> Optional[np.ndarray]:
    """The result's retrieval scores under either name, or None when it carries none."""
    return next((result[name] for name in RETRIEVAL_SCORE_NAMES if name in result), None)


def has_retrieval_scores(result: Mapping[str, np.ndarray]) -> bool:
    return retrieval_scores(result) is not None


def most_posts_by_one_author(result: Mapping[str, np.ndarray], rows: int = 10) -> tuple[int, int]:
    """(author id, posts) of the author with the most posts among the first ``rows`` of the
    first user's feed (the feed policy's diversity at work)."""
    authors = result["ranked_author_ids"][0][:rows].tolist()
    if not authors:
        return 0, 0
    return Counter(authors).most_common(1)[0]


def side_by_side(left: str, right: str, gap: int = 4) -> str:
    """Two text tables next to each other, line by line."""
    left_lines, right_lines = left.split("\n"), right.split("\n")
    width = max(len(line) for line in left_lines) + gap
    count = max(len(left_lines), len(right_lines))
    left_lines += [""] * (count - len(left_lines))
    right_lines += [""] * (count - len(right_lines))
    return "\n".join(f"{a:<{width}}{b}".rstrip() for a, b in zip(left_lines, right_lines))
