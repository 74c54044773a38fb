"""Client-side helpers shared by clients/, the demo, the load tests and the tests.

Builds request tensors from an ``example_sequence.json``-style dict, sends them with
tritonclient over HTTP or gRPC, and formats a ranked feed as a table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

TRITON_DTYPES = {
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
    np.dtype(np.float32): "FP32",
}
USER_FIELDS = {
    "history_post_ids": np.int64,
    "history_author_ids": np.int64,
    "history_actions": np.float32,
    "history_product_surface": np.int32,
}


def client_module(protocol: str):
    """``tritonclient.http`` or ``tritonclient.grpc``."""
    if protocol == "http":
        import tritonclient.http as module
    elif protocol == "grpc":
        import tritonclient.grpc as module
    else:
        raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
    return module


def connect(url: str, protocol: str = "http"):
    """An InferenceServerClient for ``url`` (host:port, no scheme)."""
    url = url.split("://", 1)[-1]
    return client_module(protocol).InferenceServerClient(url=url)


def user_inputs(
    seq: Mapping[str, Any], with_dwell: bool = False, num_actions: Optional[int] = None
) -> dict[str, np.ndarray]:
    """One user's request tensors (a leading batch dimension of 1).

    An empty JSON history (``"history_actions": []``) has no action width: pass
    ``num_actions`` (the artifact config's) to send a [1, 0, A] tensor.
    """
    arrays = {"user_id": np.array([[int(seq["user_id"])]], np.int64)}
    for name, dtype in USER_FIELDS.items():
        arrays[name] = np.asarray(seq[name], dtype)[None]
    if arrays["history_actions"].ndim != 3:  # empty history: [1, 0] -> [1, 0, A]
        if num_actions is None:
            raise ValueError("empty history_actions: pass num_actions to size the tensor")
        arrays["history_actions"] = np.zeros((1, 0, num_actions), np.float32)
    if with_dwell and seq.get("history_dwell_seconds") is not None:
        arrays["history_dwell_seconds"] = np.asarray(seq["history_dwell_seconds"], np.float32)[None]
    return arrays


def ranker_inputs(
    seq: Mapping[str, Any], with_dwell: bool = True, num_actions: Optional[int] = None
) -> dict[str, np.ndarray]:
    arrays = user_inputs(seq, with_dwell=with_dwell, num_actions=num_actions)
    arrays["candidate_post_ids"] = np.asarray(seq["candidate_post_ids"], np.int64)[None]
    arrays["candidate_author_ids"] = np.asarray(seq["candidate_author_ids"], np.int64)[None]
    if seq.get("candidate_product_surface") is not None:
        arrays["candidate_product_surface"] = np.asarray(
            seq["candidate_product_surface"], np.int32
        )[None]
    return arrays


def recommend_inputs(
    seq: Mapping[str, Any], top_k: Optional[int] = None, num_actions: Optional[int] = None
) -> dict[str, np.ndarray]:
    arrays = user_inputs(seq, num_actions=num_actions)
    arrays["top_k"] = np.array([[int(top_k or seq.get("top_k", 50))]], np.int32)
    return arrays


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
    tensors = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        tensor = module.InferInput(name, list(array.shape), TRITON_DTYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = None
    if outputs is not None:
        requested = [module.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, tensors, outputs=requested, **kwargs)
    if outputs is None:
        response = result.get_response()
        names = (
            [o["name"] for o in response["outputs"]]
            if isinstance(response, dict)
            else [o.name for o in response.outputs]
        )
        outputs = names
    return {name: result.as_numpy(name) for name in outputs}


def feed_table(
    result: Mapping[str, np.ndarray],
    action_names: Sequence[str],
    rows: int = 20,
    top_actions: int = 3,
) -> str:
    """A ranked feed as text: rank, post id, blended score, retrieval score, top actions."""
    posts = result["ranked_post_ids"][0]
    scores = result["scores"][0]
    retrieval = result.get("retrieval_scores", result.get("ranked_retrieval_scores"))
    retrieval = retrieval[0] if retrieval is not None else np.full(len(posts), np.nan)
    probs = result["action_probs"][0]
    lines = [f"{'rank':>4}  {'post id':>20}  {'score':>8}  {'retrieval':>9}  top actions"]
    for i in range(min(rows, len(posts))):
        best = np.argsort(-probs[i])[:top_actions]
        actions = ", ".join(f"{action_names[a]} {probs[i, a]:.2f}" for a in best)
        lines.append(
            f"{i + 1:>4}  {int(posts[i]):>20}  {scores[i]:>8.3f}  {retrieval[i]:>9.3f}  {actions}"
        )
    if len(posts) > rows:
        lines.append(f"... {len(posts) - rows} more")
    return "\n".join(lines)
