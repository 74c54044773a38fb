"""The contract of every served model, written once: inputs, outputs, batch sizes, limits.

Every ``model_repository/<model>/config.pbtxt`` is generated from its contract here and a
deployment profile (``profiles``) by ``configs`` (``make configs``); a test fails when a
committed config differs from the generated one. Everything else reads the contract too: the
client helpers build their request tensors from it, the load test and the benchmarks take
model names, batch sizes and the recommend chain from it, and the services name their typed
request fields after its inputs.

The language they are written in (tensors, values, parameters) is ``phoenix.schema.spec``;
recommend's wiring, chain and ensemble are ``phoenix.schema.recommend``; every served model by
name is ``phoenix.schema.served``.

Shapes in the glossary below have a leading batch dimension R (rows: users or posts) on the
wire:  L history items,  C candidates,  K retrieved posts,  D emb_size,  A num_actions,
M in-network posts (the newest posts of the authors a user follows).

Limits (``LIMITS``) are per request; larger requests get INVALID_ARG. The candidate limit is
the ranker's largest candidate bucket, so a request never needs a shape compiled on demand.

Batch buckets (``ModelContract.batch_buckets``) are the batch sizes a model compiles for: the
powers of two up to its ``max_batch_size``, which Triton's dynamic batcher never exceeds.

Imports numpy, the spec language, the production family's inputs (``production_inputs``) and
the feed policy's filter names (``phoenix.feed_policy``, numpy only), so clients, the load
test and the model stubs can all read it cheaply.
"""

from __future__ import annotations

import math

import numpy as np

from phoenix.feed_policy import FILTERS as POLICY_FILTERS
from phoenix.schema.production_inputs import (
    CANDIDATE_CONTEXT,
    HISTORY_CONTEXT_INPUTS,
    PRODUCTION_INPUTS,
    PROFILE_INPUTS,
    REQUEST_CONTEXT,
)
from phoenix.schema.spec import (
    FLAGS,
    IDS,
    POST_IDS,
    PROBABILITIES,
    SURFACES,
    Limits,
    ModelContract,
    Parameter,
    TensorSpec,
    Values,
    tensor_spec,
)

# ----------------------------------------------------------------------------------------
# Limits and buckets
# ----------------------------------------------------------------------------------------

# Candidate counts the ranker compiles for; the largest is the per-user maximum.
RANKER_CANDIDATE_BUCKETS = (16, 64, 256, 512, 1024)
# The prefix cache per ranker instance (the ranker's and the chain's: four stubs on CPUs, at
# most 512 MiB of a pod): 128 MiB holds 255 users of the mini config at history 127, 31 at
# history 1,022 (float32; docs/performance.md, "The prefix cache").
PREFIX_CACHE_MIB = 128
PREFIX_CACHE_TTL_S = 120.0

# The ranker's default blend of action probabilities, by the artifact's action names.
RANKER_SCORE_WEIGHTS = {
    "favorite": 1.0,
    "reply": 13.5,
    "repost": 1.0,
    "quote": 2.0,
    "dwell": 0.5,
    "vqv": 0.3,
}

# The feed policy after the ranker (``feed_policy``; docs/policy.md says what each parameter
# does and why its default is what it is). Weights are per action name, over every action the
# model predicts: the four negative actions push a post down. Positive weights follow the
# ranker's blend (reply the strongest signal) and add the other positive actions with small
# weights; negative weights are large because their probabilities are small and a block or
# report costs the feed far more than one more favorite earns.
POLICY_ACTION_WEIGHTS = {
    "favorite": 1.0,
    "reply": 13.5,
    "repost": 1.0,
    "photo_expand": 0.1,
    "click": 0.3,
    "profile_click": 0.2,
    "vqv": 0.3,
    "share": 1.0,
    "share_via_dm": 1.0,
    "share_via_copy_link": 1.0,
    "dwell": 0.5,
    "quote": 2.0,
    "quoted_click": 0.1,
    "follow_author": 2.0,
    "not_interested": -10.0,
    "block_author": -40.0,
    "mute_author": -20.0,
    "report": -80.0,
    "dwell_time": 0.0,
}

LIMITS = Limits(
    max_history_items=4096,
    max_candidates=RANKER_CANDIDATE_BUCKETS[-1],
    max_top_k=1024,
    max_rows=4096,
    max_filter_ids=4096,
)

# ----------------------------------------------------------------------------------------
# Parameters shared by several models
# ----------------------------------------------------------------------------------------

# Relative to a model's directory: artifacts/demo at the repository root. PHOENIX_ARTIFACT_DIR
# overrides it at start-up (serve --artifacts sets it).
DEFAULT_ARTIFACT_DIR = "../../artifacts/demo"
ARTIFACT_DIR = Parameter("artifact_dir", "text", DEFAULT_ARTIFACT_DIR)
# Written with artifact_dir by the launcher (served_repository); empty: the config does not
# say. The artifacts' version label (checkpoint.identity.artifact_version), what the metrics
# and the rollout's report name them by:
ARTIFACT_VERSION = Parameter("artifact_version", "text", "")
# sha256 of their config.json, which a client's artifacts must share (served_artifacts); no
# version: retrained weights keep it.
CONFIG_DIGEST = Parameter("config_digest", "text", "")
ARTIFACT_PARAMETERS = (ARTIFACT_DIR, ARTIFACT_VERSION, CONFIG_DIGEST)
# The batch sizes a model compiles a program for (the profile gives them; the largest reaches
# max_batch_size, which Triton's dynamic batcher never exceeds).
BATCH_BUCKETS = Parameter("batch_buckets", "ints")
# The retriever's corpus, which also holds the posts' creation times the age filter reads: a
# file or store inside the artifact directory; a load request with another value swaps it.
CORPUS_FILE = Parameter("corpus_file", "text", "corpus.npz")
# The user-state store's URL (redis://host:port/db); "" reads $PHOENIX_USER_STATE_URL, which
# serve sets. Without either, only requests carrying their own history are served.
USER_STATE_URL = Parameter("user_state_url", "text", "")

POLICY_PARAMETERS = (
    Parameter("action_weights", "weights", POLICY_ACTION_WEIGHTS),
    Parameter("negative_scores_offset", "number", 0.1, low=0),
    Parameter("author_diversity_decay", "number", 0.5, low=0, high=1),
    Parameter("author_diversity_floor", "number", 0.1, low=0, high=1),
    Parameter("filter_own_posts", "flag", True),
    # An out-of-network post's score is multiplied by this (after author diversity, as X's
    # home-mixer does): below 1 an in-network post outranks an out-of-network one of equal
    # score. 1 treats both alike; 0 puts every in-network post first. docs/policy.md.
    Parameter("out_of_network_factor", "number", 0.75, low=0, high=1),
)

# ----------------------------------------------------------------------------------------
# Tensors shared by several models
# ----------------------------------------------------------------------------------------

USER_ID = tensor_spec("user_id", np.int64, [1], values=IDS)


def history_inputs(ragged: bool) -> tuple[TensorSpec, ...]:
    """One user's history, oldest to newest: post, author, actions [L, A], surface."""
    return (
        tensor_spec("history_post_ids", np.int64, ["L"], ragged=ragged, values=IDS),
        tensor_spec("history_author_ids", np.int64, ["L"], ragged=ragged, values=IDS),
        tensor_spec("history_actions", np.float32, ["L", "A"], ragged=ragged, values=FLAGS),
        tensor_spec("history_product_surface", np.int32, ["L"], ragged=ragged, values=SURFACES),
    )


def history_dwell(optional: bool, ragged: bool) -> TensorSpec:
    """Seconds the user dwelt on each history item [L] (0: unknown, as the model reads it)."""
    values = Values(0, math.inf, "dwell")
    return tensor_spec("history_dwell_seconds", np.float32, ["L"], optional, ragged, values)


def optional(spec: TensorSpec) -> TensorSpec:
    return TensorSpec(spec.name, spec.dtype, spec.axes, True, spec.ragged, spec.values)


# The newest posts of the authors a user follows (the user state's in-network source), newest
# first; right-padded with post id 0 where rows of a request differ.
IN_NETWORK_POSTS = (
    tensor_spec("in_network_post_ids", np.int64, ["M"], values=IDS),
    tensor_spec("in_network_author_ids", np.int64, ["M"], values=IDS),
)
IN_NETWORK_INPUTS = tuple(
    tensor_spec(s.name, s.dtype, s.axes, optional=True, ragged=True, values=s.values)
    for s in IN_NETWORK_POSTS
)
# Per returned post: 1 when it came from the in-network source, else 0.
IN_NETWORK_FLAGS = tensor_spec("in_network", np.int8, ["C'"])

TOP_K = tensor_spec("top_k", np.int32, [1], values=Values(1, LIMITS.max_top_k, "top_k"))
# A post's age in seconds when it is served. UNKNOWN_AGE (any negative age) marks a post whose
# creation time is unknown: the ranker gives it the model's "unknown age" bucket, what training
# used for candidates without timestamps, and the policy's age filter never drops it.
UNKNOWN_AGE = -1.0
RANKED_OUTPUTS = (
    tensor_spec("ranked_post_ids", np.int64, ["C"]),
    tensor_spec("scores", np.float32, ["C"]),
    tensor_spec("action_probs", np.float32, ["C", "A"]),
)
RANKED_AUTHOR_IDS = tensor_spec("ranked_author_ids", np.int64, ["C"])  # the author of each post
# Per user row, the candidates the feed policy's filters dropped, per filter (in
# phoenix.feed_policy.FILTERS order, each post under the first that drops it): an empty feed
# says why.
FILTERED_COUNTS = tensor_spec("filtered_counts", np.int32, [len(POLICY_FILTERS)])

# The feed filters a recommend request may carry (all optional, per user row).
FEED_FILTERS = (
    tensor_spec("excluded_author_ids", np.int64, ["E"], optional=True, ragged=True, values=IDS),
    tensor_spec("seen_post_ids", np.int64, ["N"], optional=True, ragged=True, values=IDS),
    tensor_spec(  # older posts are dropped
        "max_age_seconds",
        np.float32,
        [1],
        optional=True,
        values=Values(0, math.inf, "ages in seconds"),
    ),  # fmt: skip
)

# ----------------------------------------------------------------------------------------
# The models
# ----------------------------------------------------------------------------------------

USER_ENCODER = ModelContract(
    name="user_encoder",
    inputs=(USER_ID, *history_inputs(ragged=True)),
    outputs=(tensor_spec("user_embedding", np.float32, ["D"]),),  # unit norm
    max_batch_size=16,
    parameters=(*ARTIFACT_PARAMETERS, BATCH_BUCKETS),
)

CANDIDATE_TOWER = ModelContract(
    name="candidate_tower",
    inputs=(
        tensor_spec("post_id", np.int64, [1], values=POST_IDS),
        tensor_spec("author_id", np.int64, [1], values=IDS),
    ),
    outputs=(tensor_spec("candidate_embedding", np.float32, ["D"]),),  # unit norm
    max_batch_size=LIMITS.max_rows,
    # One compiled program of this many rows, run as often as a batch needs.
    parameters=(*ARTIFACT_PARAMETERS, Parameter("rows_per_call", "int", low=1)),
)

RETRIEVER = ModelContract(
    name="retriever",
    inputs=(
        tensor_spec("user_embedding", np.float32, ["D"]),
        TOP_K,
        tensor_spec(  # excluded from the results
            "history_post_ids", np.int64, ["L"], optional=True, ragged=True, values=IDS
        ),
        # excluded too: the posts already served to the user (the user state's)
        tensor_spec("excluded_post_ids", np.int64, ["N"], optional=True, ragged=True, values=IDS),
        *IN_NETWORK_INPUTS,
        *REQUEST_CONTEXT,  # the production family's (below)
    ),
    # In-network posts first (newest first), then the top_k retrieved (best first), each post
    # once; rows of a request cut to its shortest row (docs/user-state.md, In-network source).
    # Ages are the corpus's creation times at answer time (UNKNOWN_AGE where it has none).
    # For the production family also each post's semantic IDs by the corpus (zeros where it
    # has none) and, when the request sends its context, the timezone and hour each post is
    # shown in: the request's (X's ranker reads them per candidate).
    outputs=(
        tensor_spec("post_ids", np.int64, ["K"]),
        tensor_spec("author_ids", np.int64, ["K"]),
        tensor_spec("retrieval_scores", np.float32, ["K"]),
        tensor_spec("post_age_seconds", np.float32, ["K"]),
        *CANDIDATE_CONTEXT,
    ),
    max_batch_size=8,
    parameters=(*ARTIFACT_PARAMETERS, BATCH_BUCKETS, CORPUS_FILE),
)

RANKER = ModelContract(
    name="ranker",
    inputs=(
        USER_ID,
        *history_inputs(ragged=True),
        history_dwell(optional=True, ragged=True),
        tensor_spec("candidate_post_ids", np.int64, ["C"], ragged=True, values=POST_IDS),
        tensor_spec("candidate_author_ids", np.int64, ["C"], ragged=True, values=IDS),
        tensor_spec(
            "candidate_product_surface",
            np.int32,
            ["C"],
            optional=True,
            ragged=True,
            values=SURFACES,
        ),  # fmt: skip
        # seconds since each post was created; UNKNOWN_AGE (negative): not known
        tensor_spec("candidate_post_age_seconds", np.float32, ["C"], optional=True, ragged=True),
        # passed through to the outputs, in ranked order
        tensor_spec("candidate_retrieval_scores", np.float32, ["C"], optional=True, ragged=True),
        # read by a production-family artifact only (above)
        *PRODUCTION_INPUTS,
    ),
    outputs=(
        *RANKED_OUTPUTS,
        RANKED_AUTHOR_IDS,
        tensor_spec("ranked_retrieval_scores", np.float32, ["C"]),
        # the candidates' ages, in ranked order (UNKNOWN_AGE where the request sent none)
        tensor_spec("ranked_post_age_seconds", np.float32, ["C"]),
    ),
    max_batch_size=8,
    parameters=(
        *ARTIFACT_PARAMETERS,
        BATCH_BUCKETS,
        # Candidate counts compiled for; the largest must be LIMITS.max_candidates.
        Parameter("candidate_buckets", "ints", RANKER_CANDIDATE_BUCKETS),
        Parameter("score_weights", "weights", RANKER_SCORE_WEIGHTS),
        # Rank the requests of a batch padded to different candidate buckets in one call per
        # bucket, not all padded to the widest: on a CPU the cost follows the padded shape
        # (docs/user-state.md, "Where the CPU goes"). Off in the GPU profile (not measured there).
        Parameter("split_widths", "flag", True),
        # The per-user prefix cache across requests (docs/architecture.md, "The prefix cache"):
        # at most this many MiB of the users' prefixes per instance (host memory on CPUs,
        # device memory on GPUs), least recently used out; 0 turns it off.
        Parameter("prefix_cache_mib", "int", PREFIX_CACHE_MIB, low=0),
        # seconds an entry is kept after it was computed, used or not
        Parameter("prefix_cache_ttl_s", "number", PREFIX_CACHE_TTL_S, low=1.0),
    ),
)

# A feed: the C' <= C posts the feed policy keeps of a user's C ranked candidates, in order.
FEED_OUTPUTS = (
    tensor_spec("ranked_post_ids", np.int64, ["C'"]),
    tensor_spec("scores", np.float32, ["C'"]),
    tensor_spec("action_probs", np.float32, ["C'", "A"]),
    tensor_spec("ranked_author_ids", np.int64, ["C'"]),
    tensor_spec("retrieval_scores", np.float32, ["C'"]),
    FILTERED_COUNTS,
    IN_NETWORK_FLAGS,
)


def renamed(spec: TensorSpec, name: str) -> TensorSpec:
    return TensorSpec(name, spec.dtype, spec.axes, spec.optional, spec.ragged, spec.values)


# The feed policy: the ranker's candidates (in its order) filtered, scored by every action and
# diversified by author. C' <= C posts stay; rows of a multi-user request are padded to the
# longest with post id 0 (real post ids are >= 1).
FEED_POLICY = ModelContract(
    name="feed_policy",
    inputs=(
        USER_ID,
        tensor_spec("candidate_post_ids", np.int64, ["C"], ragged=True, values=POST_IDS),  # ranked
        tensor_spec("candidate_author_ids", np.int64, ["C"], ragged=True, values=IDS),
        tensor_spec(
            "candidate_action_probs", np.float32, ["C", "A"], ragged=True, values=PROBABILITIES
        ),
        tensor_spec("candidate_retrieval_scores", np.float32, ["C"], optional=True, ragged=True),
        # the ages max_age_seconds reads (UNKNOWN_AGE: never dropped for its age); absent: the
        # policy looks them up in its corpus
        tensor_spec("candidate_post_age_seconds", np.float32, ["C"], optional=True, ragged=True),
        *FEED_FILTERS,
        # a candidate among them is in-network (out_of_network_factor spares it); absent: none
        IN_NETWORK_INPUTS[0],
    ),
    # the feed, its retrieval scores named as the ranker's (recommend answers them as
    # retrieval_scores)
    outputs=tuple(
        renamed(s, "ranked_retrieval_scores") if s.name == "retrieval_scores" else s
        for s in FEED_OUTPUTS
    ),
    max_batch_size=8,
    parameters=(*ARTIFACT_PARAMETERS, *POLICY_PARAMETERS, CORPUS_FILE),
)


# The user's state, read from the user-state store (Redis; docs/user-state.md) by user id, as
# the rest of the chain takes it: the ranking history (every engagement), the retrieval history
# (positive engagement only; the user tower's), the posts already served and the in-network
# posts (the newest of the followed authors', capped per author and in all by
# UserStateLimits). A request that carries its own history gets that history back as both
# (nothing is read, no served or in-network posts); a user the store does not know gets empty
# histories (L = 0). Histories from the store hold at most the artifact's history_seq_len
# items, oldest first; rows are right-padded with id 0.
#
# For artifacts of the production family (docs/production.md) it also answers what that ranker
# reads (``PRODUCTION_STATE``): the ranking history's context per item (its posts' semantic IDs
# looked up in the corpus store, as the corpus_file parameter names it), the user's profile and
# the request's context (timezone and local hour + 1: the request's own, else the profile's home
# timezone at the server's clock). A request carrying its history may carry the items' context
# (its semantic IDs, when left out, are looked up by post) and the profile too; by id both
# come from the store. An artifact of the original family answers none of them and reads no
# corpus.
USER_HISTORY = (*history_inputs(ragged=True), history_dwell(optional=True, ragged=True))
USER_HISTORY_NAMES = tuple(spec.name for spec in USER_HISTORY)  # history_post_ids, ...
PRODUCTION_STATE = tuple(  # optional outputs: answered for the production family only
    tensor_spec(s.name, s.dtype, s.axes, optional=True)
    for s in (*HISTORY_CONTEXT_INPUTS, *PROFILE_INPUTS, *REQUEST_CONTEXT)
)
PRODUCTION_STATE_NAMES = tuple(spec.name for spec in PRODUCTION_STATE)
RETRIEVAL_PREFIX = "retrieval_"
USER_STATE = ModelContract(
    name="user_state",
    inputs=(
        USER_ID,
        *(optional(spec) for spec in USER_HISTORY),
        *HISTORY_CONTEXT_INPUTS,
        *PROFILE_INPUTS,
        *REQUEST_CONTEXT,
    ),
    outputs=(
        *(tensor_spec(s.name, s.dtype, s.axes) for s in USER_HISTORY),
        *(tensor_spec(RETRIEVAL_PREFIX + s.name, s.dtype, s.axes) for s in USER_HISTORY),
        tensor_spec("served_post_ids", np.int64, ["N"]),  # newest first
        *IN_NETWORK_POSTS,
        *PRODUCTION_STATE,  # the production family's only
    ),
    max_batch_size=8,
    parameters=(*ARTIFACT_PARAMETERS, USER_STATE_URL, CORPUS_FILE),
)


# The last stage of recommend's chain, a side effect of serving (docs/user-state.md): the feed's
# posts marked served to the user (the next by-id request's user_state stage reads them and the
# retriever excludes them), and one request log entry per user row with what the models used
# and what was returned. It answers a new request id per user row (int64, the training logs'
# request_id). Its inputs are the ranking history, the retriever's candidates and the feed;
# sent_history_post_ids is the request's own history when it carried one (only its presence
# is read: such requests are logged but mark nothing served, as they read nothing). A store
# that is down or unset loses the write (logged and counted), never the feed.
REQUEST_ID = tensor_spec("request_id", np.int64, [1])  # a new one per user row, never 0
SERVED_LOG = ModelContract(
    name="served_log",
    inputs=(
        USER_ID,
        *history_inputs(ragged=True),
        history_dwell(optional=False, ragged=True),
        tensor_spec(
            "sent_history_post_ids", np.int64, ["L"], optional=True, ragged=True, values=IDS
        ),
        tensor_spec("candidate_post_ids", np.int64, ["K"], ragged=True, values=IDS),
        tensor_spec("candidate_author_ids", np.int64, ["K"], ragged=True, values=IDS),
        tensor_spec("candidate_retrieval_scores", np.float32, ["K"], ragged=True),
        tensor_spec("ranked_post_ids", np.int64, ["C'"], ragged=True, values=IDS),  # 0: padding
        tensor_spec("ranked_author_ids", np.int64, ["C'"], ragged=True, values=IDS),
        tensor_spec("scores", np.float32, ["C'"], ragged=True),
        tensor_spec("retrieval_scores", np.float32, ["C'"], ragged=True),
        tensor_spec("action_probs", np.float32, ["C'", "A"], ragged=True, values=PROBABILITIES),
        # which source each post came from (1: in-network), for training on what was served
        tensor_spec("in_network", np.int8, ["C'"], ragged=True, values=Values(0, 1, "flags")),
        FILTERED_COUNTS,
    ),
    outputs=(REQUEST_ID,),
    max_batch_size=8,
    parameters=(*ARTIFACT_PARAMETERS, USER_STATE_URL),
)


# The models the recommend chain's stages run, in the chain's order.
STAGE_MODELS = (
    USER_STATE,
    USER_ENCODER,
    CANDIDATE_TOWER,
    RETRIEVER,
    RANKER,
    FEED_POLICY,
    SERVED_LOG,
)
