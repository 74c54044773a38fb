"""The probe request: one row that reaches a model's stub and is refused by its validation."""

from __future__ import annotations

import numpy as np

from phoenix.serving.contracts import CONTRACTS


def probe_inputs(model: str) -> dict[str, np.ndarray] | None:
    """{input name: array} of one probe request of ``model``; None for a model without a
    contract (nothing known to send) or an ensemble (it has no stub of its own).

    Every required input of the model's contract, one row, every value -1: ids must be >= 0,
    top_k >= 1, actions in [0, 1] and embeddings have D > 1 values, so the stub answers
    INVALID_ARG at once, proof that it is alive, without doing work. Triton itself only
    checks names, types and shapes, which are right.
    """
    spec = CONTRACTS.get(model)
    if spec is None or spec.is_ensemble:
        return None
    return {
        tensor.name: np.full([1] + [1 if d == -1 else d for d in tensor.dims], -1, tensor.dtype)
        for tensor in spec.inputs
        if not tensor.optional
    }
