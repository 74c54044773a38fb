"""The probe request: one row that reaches a model's stub and is refused by its validation.

Kept in one small function on purpose: it is the only place that builds inference inputs
from a model config, and it will read the per-model contract once that exists.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# -1 everywhere: ids must be >= 0, top_k >= 1, actions in [0, 1], embeddings have D > 1 values.
_PROBE_DTYPES = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32, "FP64": np.float64}


def probe_inputs(config: Mapping) -> dict[str, np.ndarray] | None:
    """{input name: array} of one probe request; None when an input has a type we cannot fill.

    Triton itself only checks names, types and shapes, which are right, so the stub answers
    INVALID_ARG at once: proof that it is alive, without doing work.
    """
    batched = int(config.get("max_batch_size", 0)) > 0
    inputs = {}
    for spec in config.get("input") or []:
        if spec.get("optional"):
            continue
        datatype = spec["data_type"].removeprefix("TYPE_")
        if datatype not in _PROBE_DTYPES:
            return None
        shape = ([1] if batched else []) + [1 if int(d) == -1 else int(d) for d in spec["dims"]]
        inputs[spec["name"]] = np.full(shape, -1, _PROBE_DTYPES[datatype])
    return inputs
