"""What X's production ranker reads besides ids (the production family, docs/production.md),
as served inputs and outputs: the history's and candidates' context, the user's profile, the
request's context, and what the retriever answers of each post for this family.

Named and bounded as phoenix.feed_features declares the feed's features. phoenix.schema.contracts
puts them in the models' contracts. Imports numpy, the spec language and phoenix.feed_features.
"""

from __future__ import annotations

import numpy as np

from phoenix.feed_features import (
    HISTORY_FEATURES,
    PROFILE_FEATURES,
    SID_NUM_LEVELS,
    Feature,
    feature,
)
from phoenix.schema.spec import TensorSpec, Values, tensor_spec

# Named and bounded as phoenix.feed_features declares the feed's features: per history item or
# candidate with the prefix ``history_`` or ``candidate_`` (as history_product_surface), the
# user's profile under the feature's own name. Every one is optional: a production ranker
# reads a left-out one as X's "unknown" (0), an original one refuses them all (it reads none).
# The history's surface and dwell time are the ranker's existing history_product_surface and
# history_dwell_seconds; a candidate's post age is candidate_post_age_seconds.
INT32_SECONDS = 2**31 - 1  # X's model reads times as int32 Unix seconds


def feature_values(f: Feature) -> Values:
    """The Values of a feed feature: its inclusive range (times within X's int32 seconds)."""
    if f.kind == "apps":
        return Values(0, 1, "flags")
    if f.kind == "time":
        return Values(f.low, min(f.high, INT32_SECONDS), "Unix seconds")
    return Values(f.low, f.high, f.name.replace("_", " ") + " values")


def feature_spec(name: str, f: Feature, axes: list) -> TensorSpec:
    """An optional input of feature ``f``; an app set travels as int8 flags [64] (DLPack has
    no bool for Triton's Python stub)."""
    dtype = np.int8 if f.kind == "apps" else f.dtype
    axes = axes + ([f.width] if f.width else [])
    ragged = bool(axes) and axes[0] in ("L", "C")
    return tensor_spec(name, dtype, axes or [1], True, ragged, feature_values(f))


HISTORY_CONTEXT_FEATURES = ("impression_time", "creation_time", "timezone", "hour_of_day",
                            "semantic_ids")  # fmt: skip
CANDIDATE_CONTEXT_FEATURES = ("timezone", "hour_of_day", "semantic_ids")
PRODUCTION_INPUTS = (
    *(
        feature_spec("history_" + name, feature(name, HISTORY_FEATURES), ["L"])
        for name in HISTORY_CONTEXT_FEATURES
    ),
    *(
        feature_spec("candidate_" + name, feature(name, HISTORY_FEATURES), ["C"])
        for name in CANDIDATE_CONTEXT_FEATURES
    ),
    *(feature_spec(f.name, f, []) for f in PROFILE_FEATURES),
)
PRODUCTION_INPUT_NAMES = tuple(spec.name for spec in PRODUCTION_INPUTS)

# The history's and the profile's (what the user_state stage answers for this family).
HISTORY_CONTEXT_INPUTS = tuple(s for s in PRODUCTION_INPUTS if s.name.startswith("history_"))
PROFILE_INPUTS = tuple(s for s in PRODUCTION_INPUTS if s.name in {f.name for f in PROFILE_FEATURES})

# The context of a recommend request: its timezone and local hour + 1 (the request's own when
# it sends them, else the user's home timezone at the server's clock).
REQUEST_CONTEXT = tuple(
    feature_spec("request_" + name, feature(name, HISTORY_FEATURES), [])
    for name in ("timezone", "hour_of_day")
)

# What the retriever answers of each post for the production family: its semantic IDs and the
# request's timezone and hour it is shown in.
CANDIDATE_CONTEXT = (  # optional outputs: answered for the production family only
    tensor_spec("semantic_ids", np.int32, ["K", SID_NUM_LEVELS], optional=True),
    tensor_spec("timezone", np.int32, ["K"], optional=True),
    tensor_spec("hour_of_day", np.int32, ["K"], optional=True),
)
