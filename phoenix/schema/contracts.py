"""The contract of every served model, written once: inputs, outputs, batch sizes, limits.

Every ``model_repository/<model>/config.pbtxt`` is generated from its contract here and a
deployment profile (``profiles``) by ``configs`` (``make configs``); a test fails when a
committed config differs from the generated one. Everything else reads the contract too: the
client helpers build their request tensors from it, the load test and the benchmarks take
model names, batch sizes and the recommend chain from it, and the services name their typed
request fields after its inputs.

Per input (``TensorSpec``):

    name          the tensor's name on the wire
    dtype         numpy dtype (``triton_dtype`` "INT64", ``config_dtype`` "TYPE_INT64")
    dims          shape without the batch dimension; -1 is any length
    optional      the request may leave it out
    ragged        ``allow_ragged_batch``: requests of different lengths share one batch

Shapes in the glossary below have a leading batch dimension R (rows: users or posts) on the
wire:  L history items,  C candidates,  K retrieved posts,  D emb_size,  A num_actions,
M in-network posts (the newest posts of the authors a user follows).

Limits (``LIMITS``) are per request; larger requests get INVALID_ARG. The candidate limit is
the ranker's largest candidate bucket, so a request never needs a shape compiled on demand.

Batch buckets (``ModelContract.batch_buckets``) are the batch sizes a model compiles for: the
powers of two up to its ``max_batch_size``, which Triton's dynamic batcher never exceeds.

This module imports numpy, tritonclient's dtype helper and the feed policy's filter names
(``phoenix.feed_policy``, numpy only) only, so clients, the load test and the model stubs can
all read it cheaply.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from phoenix.feed_policy import FILTERS as POLICY_FILTERS

# ----------------------------------------------------------------------------------------
# Types
# ----------------------------------------------------------------------------------------


# Symbolic axes of a tensor (besides the batch dimension). A length symbol groups inputs that
# must share one length and names the per-request limit on it; a width symbol is fixed by the
# loaded artifacts. Everything else an input's values must satisfy is its ``Values``.
LENGTH_LIMITS = {  # symbol -> the Limits field capping it
    "L": "max_history_items",  # history items
    "C": "max_candidates",  # candidates of one user row
    "E": "max_filter_ids",  # excluded authors
    "N": "max_filter_ids",  # seen posts
    "M": "max_candidates",  # in-network posts: every one of them can become a candidate
    # retrieved and kept by the policy: outputs, and served_log's inputs (the ranker takes no
    # more candidates than this, so neither list is longer)
    "K": "max_candidates",
    "C'": "max_candidates",
}
ARTIFACT_WIDTHS = {"D": "emb_size", "A": "num_actions"}  # symbol -> artifact config field
Axis = Union[int, str]


@dataclass(frozen=True)
class Values:
    """What an input's values must be, beyond its dtype (float inputs are always finite).

    ``high`` may name an artifact limit instead of a number: "surfaces" is the artifact's
    largest product surface.
    """

    low: Optional[float] = None
    high: Union[float, str, None] = None
    what: str = "values"


IDS = Values(low=0, what="ids")  # 0 is padding where it is allowed
POST_IDS = Values(low=1, what="ids")  # candidates and posts: 0 would read as padding
SURFACES = Values(low=0, high="surfaces", what="surfaces")
FLAGS = Values(0, 1, "action flags")
PROBABILITIES = Values(0, 1, "probabilities")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of a model."""

    name: str
    dtype: np.dtype
    axes: tuple[Axis, ...]  # without the batch dimension: sizes or symbols (module docstring)
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch
    values: Values = Values()

    @property
    def dims(self) -> tuple[int, ...]:
        """The config's dims: fixed sizes, and -1 for every symbolic axis."""
        return tuple(axis if isinstance(axis, int) else -1 for axis in self.axes)

    @property
    def length(self) -> Optional[str]:
        """The length symbol of axis 1 (history, candidates, filter ids), if it has one."""
        first = self.axes[0] if self.axes else None
        return first if first in LENGTH_LIMITS else None

    @property
    def triton_dtype(self) -> str:
        """The KServe v2 datatype, e.g. "INT64"."""
        return np_to_triton_dtype(self.dtype)

    @property
    def config_dtype(self) -> str:
        """The data_type of config.pbtxt, e.g. "TYPE_INT64"."""
        return f"TYPE_{self.triton_dtype}"

    @property
    def ndim(self) -> int:
        """Dimensions on the wire, batch dimension included."""
        return 1 + len(self.axes)


# ----------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parameter:
    """A config parameter a model reads at start-up: its kind, default and range.

    Config parameters are strings; ``text`` writes a value into a config and ``parse`` reads it
    back, so both directions live here. ``default`` None: the deployment profile (or serve)
    must give it.
    """

    name: str
    kind: str  # "text", "int", "ints" (sorted positive), "number", "flag", "weights"
    default: Any = None
    low: float = -math.inf
    high: float = math.inf

    def text(self, value: Any) -> str:
        """The config string of ``value`` (checked by parsing it back)."""
        if self.kind == "ints":
            text = ",".join(str(int(v)) for v in value)
        elif self.kind == "flag":
            text = "true" if value else "false"
        elif self.kind == "weights":
            text = value if isinstance(value, str) else json.dumps(dict(value))
        else:
            text = str(value)
        self.parse(text)
        return text

    def parse(self, text: str) -> Any:
        """The typed value of a config string; ValueError naming the parameter."""
        where = f"parameter '{self.name}'"
        if self.kind == "text":
            return text
        if self.kind == "flag":
            if text.strip().lower() not in ("true", "false"):
                raise ValueError(f"{where} must be 'true' or 'false', got {text!r}")
            return text.strip().lower() == "true"
        if self.kind == "weights":
            return _parse_weights(where, text)
        if self.kind == "ints":
            values = _parse_ints(where, text)
            if not values:
                raise ValueError(f"{where} must list positive ints, got {text!r}")
            return tuple(sorted(values))
        number = _parse_number(where, text, integer=self.kind == "int")
        if not (self.low <= number <= self.high):  # also refuses NaN
            raise ValueError(f"{where} must lie in [{self.low}, {self.high}], got {text!r}")
        return number


def _parse_ints(where: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{where} must be a comma-separated list of ints: {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{where} must list positive ints, got {text!r}")
    return values


def _parse_number(where: str, text: str, integer: bool) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an int" if integer else "a number"
        raise ValueError(f"{where} must be {kind}, got {text!r}") from None


def _parse_weights(where: str, text: str) -> dict[str, float]:
    """{action name: weight}; which names exist is the artifact's to say (the service checks)."""
    try:
        weights = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not valid JSON ({error}): {text!r}") from None
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"{where} must be a non-empty JSON object of action: weight")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"{where}: the weight of {name!r} must be a number, got {weight!r}")
        if not math.isfinite(weight):
            raise ValueError(f"{where}: the weight of {name!r} must be finite, got {weight}")
    return {name: float(weight) for name, weight in weights.items()}


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: which model, fed from and feeding which ensemble tensors."""

    model: str
    input_map: Mapping[str, str]  # the model's input name -> ensemble tensor name
    output_map: Mapping[str, str]  # the model's output name -> ensemble tensor name
    # A step that writes state and changes no other step's answer (served_log): in-process
    # references of the chain (--check, benchmarks) leave it out, so they write nothing.
    side_effect: bool = False


@dataclass(frozen=True)
class ModelContract:
    """What a served model accepts and returns."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    backend: Optional[str] = "python"
    platform: Optional[str] = None  # "ensemble" for ensembles (then no backend)
    steps: tuple[EnsembleStep, ...] = ()  # ensembles only, in order
    # A chain model's stages: served models whose services it runs in its own process, in
    # order, wired as the steps of an ensemble would be (``RECOMMEND_CHAIN``).
    stages: tuple[EnsembleStep, ...] = ()
    # Config parameters the model reads at start-up (defaults here, the rest from profiles).
    parameters: tuple[Parameter, ...] = ()

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, f"{self.name} input")

    def parameter(self, name: str) -> Parameter:
        for declared in self.parameters:
            if declared.name == name:
                return declared
        known = [p.name for p in self.parameters]
        raise KeyError(f"{self.name} has no parameter {name!r}; it reads {known}")

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def parameter_texts(self, values: Mapping[str, Any]) -> dict[str, str]:
        """The config strings of the defaults overridden by ``values`` ({name: typed value});
        a parameter with neither a default nor a value, or an undeclared one, is an error."""
        undeclared = sorted(set(values) - set(self.parameter_names))
        if undeclared:
            raise KeyError(f"{self.name} declares no parameters {undeclared}")
        texts = {}
        for p in self.parameters:
            value = values.get(p.name, p.default)
            if value is None:
                raise ValueError(f"{self.name}: parameter '{p.name}' has no default and no value")
            texts[p.name] = p.text(value)
        return texts

    def parse_parameters(self, texts: Mapping[str, str]) -> dict[str, Any]:
        """Every declared parameter's typed value from config strings (others are ignored:
        a reload may add markers); a missing one is an error."""
        missing = [p.name for p in self.parameters if p.name not in texts]
        if missing:
            raise ValueError(
                f"{self.name}: config parameters {missing} are missing (configs are generated "
                "by `make configs`)"
            )
        return {p.name: p.parse(texts[p.name]) for p in self.parameters}

    @property
    def compiles_batches(self) -> bool:
        """Whether the model compiles a program per batch size (it reads batch_buckets)."""
        return "batch_buckets" in self.parameter_names

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs)

    @property
    def required_inputs(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs if not spec.optional)

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """Powers of two up to max_batch_size (the batch sizes compiled at start-up)."""
        return powers_of_two_up_to(self.max_batch_size)

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble"

    def step(self, model: str) -> EnsembleStep:
        for step in self.steps or self.stages:
            if step.model == model:
                return step
        raise KeyError(f"{self.name} has no step running {model!r}")


@dataclass(frozen=True)
class Limits:
    """Hard per-request limits (documented in README and SECURITY.md)."""

    max_history_items: int  # longer histories are refused; the newest S are used
    max_candidates: int  # per user row of a ranker request
    max_top_k: int
    max_rows: int  # batch rows in one request (candidate_tower posts, users)
    max_filter_ids: int  # excluded authors or seen posts per user row of a feed request


def _by_name(specs: tuple[TensorSpec, ...], name: str, what: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(f"no {what} named {name!r}")


def powers_of_two_up_to(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``, and ``limit`` itself when it is no power of two."""
    buckets = [1]
    while buckets[-1] * 2 <= limit:
        buckets.append(buckets[-1] * 2)
    if buckets[-1] != limit and limit > 1:
        buckets.append(limit)
    return tuple(buckets)


def _spec(name, dtype, axes, optional=False, ragged=False, values=Values()) -> TensorSpec:
    return TensorSpec(name, np.dtype(dtype), tuple(axes), optional, ragged, values)


# ----------------------------------------------------------------------------------------
# Limits and buckets
# ----------------------------------------------------------------------------------------

# Candidate counts the ranker compiles for; the largest is the per-user maximum.
RANKER_CANDIDATE_BUCKETS = (16, 64, 256, 512, 1024)

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
# sha256 of the artifact directory's config.json, written with artifact_dir by the launcher
# (served_artifacts): clients compare it with theirs. Empty: the config does not say.
ARTIFACT_DIGEST = Parameter("artifact_digest", "text", "")
ARTIFACT_PARAMETERS = (ARTIFACT_DIR, ARTIFACT_DIGEST)
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

USER_ID = _spec("user_id", np.int64, [1], values=IDS)


def history_inputs(ragged: bool) -> tuple[TensorSpec, ...]:
    """One user's history, oldest to newest: post, author, actions [L, A], surface."""
    return (
        _spec("history_post_ids", np.int64, ["L"], ragged=ragged, values=IDS),
        _spec("history_author_ids", np.int64, ["L"], ragged=ragged, values=IDS),
        _spec("history_actions", np.float32, ["L", "A"], ragged=ragged, values=FLAGS),
        _spec("history_product_surface", np.int32, ["L"], ragged=ragged, values=SURFACES),
    )


def history_dwell(optional: bool, ragged: bool) -> TensorSpec:
    """Seconds the user dwelt on each history item [L] (0: unknown, as the model reads it)."""
    values = Values(0, math.inf, "dwell")
    return _spec("history_dwell_seconds", np.float32, ["L"], optional, ragged, values)


def _optional(spec: TensorSpec) -> TensorSpec:
    return TensorSpec(spec.name, spec.dtype, spec.axes, True, spec.ragged, spec.values)


# The newest posts of the authors a user follows (the user state's in-network source), newest
# first; right-padded with post id 0 where rows of a request differ.
IN_NETWORK_POSTS = (
    _spec("in_network_post_ids", np.int64, ["M"], values=IDS),
    _spec("in_network_author_ids", np.int64, ["M"], values=IDS),
)
IN_NETWORK_INPUTS = tuple(
    _spec(s.name, s.dtype, s.axes, optional=True, ragged=True, values=s.values)
    for s in IN_NETWORK_POSTS
)
# Per returned post: 1 when it came from the in-network source, else 0.
IN_NETWORK_FLAGS = _spec("in_network", np.int8, ["C'"])

TOP_K = _spec("top_k", np.int32, [1], values=Values(1, LIMITS.max_top_k, "top_k"))
# A post's age in seconds when it is served. UNKNOWN_AGE (any negative age) marks a post whose
# creation time is unknown: the ranker gives it the model's "unknown age" bucket, what training
# used for candidates without timestamps, and the policy's age filter never drops it.
UNKNOWN_AGE = -1.0
RANKED_OUTPUTS = (
    _spec("ranked_post_ids", np.int64, ["C"]),
    _spec("scores", np.float32, ["C"]),
    _spec("action_probs", np.float32, ["C", "A"]),
)
RANKED_AUTHOR_IDS = _spec("ranked_author_ids", np.int64, ["C"])  # the author of each post
# Per user row, the candidates the feed policy's filters dropped, per filter (in
# phoenix.feed_policy.FILTERS order, each post under the first that drops it): an empty feed
# says why.
FILTERED_COUNTS = _spec("filtered_counts", np.int32, [len(POLICY_FILTERS)])

# The feed filters a recommend request may carry (all optional, per user row).
FEED_FILTERS = (
    _spec("excluded_author_ids", np.int64, ["E"], optional=True, ragged=True, values=IDS),
    _spec("seen_post_ids", np.int64, ["N"], optional=True, ragged=True, values=IDS),
    _spec(  # older posts are dropped
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
    outputs=(_spec("user_embedding", np.float32, ["D"]),),  # unit norm
    max_batch_size=16,
    parameters=(*ARTIFACT_PARAMETERS, BATCH_BUCKETS),
)

CANDIDATE_TOWER = ModelContract(
    name="candidate_tower",
    inputs=(
        _spec("post_id", np.int64, [1], values=POST_IDS),
        _spec("author_id", np.int64, [1], values=IDS),
    ),
    outputs=(_spec("candidate_embedding", np.float32, ["D"]),),  # unit norm
    max_batch_size=LIMITS.max_rows,
    # One compiled program of this many rows, run as often as a batch needs.
    parameters=(*ARTIFACT_PARAMETERS, Parameter("rows_per_call", "int", low=1)),
)

RETRIEVER = ModelContract(
    name="retriever",
    inputs=(
        _spec("user_embedding", np.float32, ["D"]),
        TOP_K,
        _spec(  # excluded from the results
            "history_post_ids", np.int64, ["L"], optional=True, ragged=True, values=IDS
        ),
        # excluded too: the posts already served to the user (the user state's)
        _spec("excluded_post_ids", np.int64, ["N"], optional=True, ragged=True, values=IDS),
        *IN_NETWORK_INPUTS,
    ),
    # In-network posts first (newest first), then the top_k retrieved (best first), each post
    # once; rows of a request cut to its shortest row (docs/user-state.md, In-network source).
    # Ages are the corpus's creation times at answer time (UNKNOWN_AGE where it has none).
    outputs=(
        _spec("post_ids", np.int64, ["K"]),
        _spec("author_ids", np.int64, ["K"]),
        _spec("retrieval_scores", np.float32, ["K"]),
        _spec("post_age_seconds", np.float32, ["K"]),
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
        _spec("candidate_post_ids", np.int64, ["C"], ragged=True, values=POST_IDS),
        _spec("candidate_author_ids", np.int64, ["C"], ragged=True, values=IDS),
        _spec(
            "candidate_product_surface",
            np.int32,
            ["C"],
            optional=True,
            ragged=True,
            values=SURFACES,
        ),  # fmt: skip
        # seconds since each post was created; UNKNOWN_AGE (negative): not known
        _spec("candidate_post_age_seconds", np.float32, ["C"], optional=True, ragged=True),
        # passed through to the outputs, in ranked order
        _spec("candidate_retrieval_scores", np.float32, ["C"], optional=True, ragged=True),
    ),
    outputs=(
        *RANKED_OUTPUTS,
        RANKED_AUTHOR_IDS,
        _spec("ranked_retrieval_scores", np.float32, ["C"]),
        # the candidates' ages, in ranked order (UNKNOWN_AGE where the request sent none)
        _spec("ranked_post_age_seconds", np.float32, ["C"]),
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
    ),
)

# The feed policy: the ranker's candidates (in its order) filtered, scored by every action and
# diversified by author. C' <= C posts stay; rows of a multi-user request are padded to the
# longest with post id 0 (real post ids are >= 1).
FEED_POLICY = ModelContract(
    name="feed_policy",
    inputs=(
        USER_ID,
        _spec("candidate_post_ids", np.int64, ["C"], ragged=True, values=POST_IDS),  # ranked
        _spec("candidate_author_ids", np.int64, ["C"], ragged=True, values=IDS),
        _spec("candidate_action_probs", np.float32, ["C", "A"], ragged=True, values=PROBABILITIES),
        _spec("candidate_retrieval_scores", np.float32, ["C"], optional=True, ragged=True),
        # the ages max_age_seconds reads (UNKNOWN_AGE: never dropped for its age); absent: the
        # policy looks them up in its corpus
        _spec("candidate_post_age_seconds", np.float32, ["C"], optional=True, ragged=True),
        *FEED_FILTERS,
        # a candidate among them is in-network (out_of_network_factor spares it); absent: none
        IN_NETWORK_INPUTS[0],
    ),
    outputs=(
        _spec("ranked_post_ids", np.int64, ["C'"]),
        _spec("scores", np.float32, ["C'"]),
        _spec("action_probs", np.float32, ["C'", "A"]),
        _spec("ranked_author_ids", np.int64, ["C'"]),
        _spec("ranked_retrieval_scores", np.float32, ["C'"]),
        FILTERED_COUNTS,
        IN_NETWORK_FLAGS,
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
USER_HISTORY = (*history_inputs(ragged=True), history_dwell(optional=True, ragged=True))
USER_HISTORY_NAMES = tuple(spec.name for spec in USER_HISTORY)  # history_post_ids, ...
RETRIEVAL_PREFIX = "retrieval_"
USER_STATE = ModelContract(
    name="user_state",
    inputs=(
        USER_ID,
        *(_optional(spec) for spec in USER_HISTORY),
    ),
    outputs=(
        *(_spec(s.name, s.dtype, s.axes) for s in USER_HISTORY),
        *(_spec(RETRIEVAL_PREFIX + s.name, s.dtype, s.axes) for s in USER_HISTORY),
        _spec("served_post_ids", np.int64, ["N"]),  # newest first
        *IN_NETWORK_POSTS,
    ),
    max_batch_size=8,
    parameters=(*ARTIFACT_PARAMETERS, USER_STATE_URL),
)


# The last stage of recommend's chain, a side effect of serving (docs/user-state.md): the feed's
# posts marked served to the user (the next by-id request's user_state stage reads them and the
# retriever excludes them), and one request log entry per user row with what the models used
# and what was returned. It answers a new request id per user row (int64, the training logs'
# request_id). Its inputs are the ranking history, the retriever's candidates and the feed;
# sent_history_post_ids is the request's own history when it carried one (only its presence
# is read: such requests are logged but mark nothing served, as they read nothing). A store
# that is down or unset loses the write (logged and counted), never the feed.
REQUEST_ID = _spec("request_id", np.int64, [1])  # a new one per user row, never 0
FEED_OUTPUTS = (
    *RANKED_OUTPUTS,
    RANKED_AUTHOR_IDS,
    _spec("retrieval_scores", np.float32, ["C"]),
    FILTERED_COUNTS,
    IN_NETWORK_FLAGS,
)
SERVED_LOG = ModelContract(
    name="served_log",
    inputs=(
        USER_ID,
        *history_inputs(ragged=True),
        history_dwell(optional=False, ragged=True),
        _spec("sent_history_post_ids", np.int64, ["L"], optional=True, ragged=True, values=IDS),
        _spec("candidate_post_ids", np.int64, ["K"], ragged=True, values=IDS),
        _spec("candidate_author_ids", np.int64, ["K"], ragged=True, values=IDS),
        _spec("candidate_retrieval_scores", np.float32, ["K"], ragged=True),
        _spec("ranked_post_ids", np.int64, ["C'"], ragged=True, values=IDS),  # 0: padding
        _spec("ranked_author_ids", np.int64, ["C'"], ragged=True, values=IDS),
        _spec("scores", np.float32, ["C'"], ragged=True),
        _spec("retrieval_scores", np.float32, ["C'"], ragged=True),
        _spec("action_probs", np.float32, ["C'", "A"], ragged=True, values=PROBABILITIES),
        # which source each post came from (1: in-network), for training on what was served
        _spec("in_network", np.int8, ["C'"], ragged=True, values=Values(0, 1, "flags")),
        FILTERED_COUNTS,
    ),
    outputs=(REQUEST_ID,),
    max_batch_size=8,
    parameters=(*ARTIFACT_PARAMETERS, USER_STATE_URL),
)


def _same_names(names) -> dict[str, str]:
    return {name: name for name in names}


_TOWER_HISTORY_NAMES = tuple(spec.name for spec in history_inputs(ragged=False))  # no dwell

# The recommend request: a user by id (the history read from the user state) or with the
# history, how many posts to retrieve, and the feed filters.
RECOMMEND_INPUTS = (
    USER_ID,
    *(_optional(s) for s in history_inputs(ragged=False)),
    history_dwell(optional=True, ragged=False),
    TOP_K,
    *FEED_FILTERS,
)
RECOMMEND_OUTPUTS = (
    *FEED_OUTPUTS,
    REQUEST_ID,  # what engagements with this feed refer to
)

# The stages of recommend: read the user's state (or take the request's history), encode the
# user by the retrieval history, retrieve top_k posts neither in the history nor served before
# and add the in-network posts (each dated by the corpus), rank them by the ranking history and
# their ages, apply the feed policy (which favours the in-network posts by
# out_of_network_factor, flags them and reads the same ages for max_age_seconds), then record
# what was served (served_log: the posts marked served, the request log, the request id
# returned). Tensors starting with "_" live only inside the chain. The optional inputs (the
# history, the feed filters) reach their stage only when the request carries them.
RECOMMEND_STAGES = (
    EnsembleStep(
        "user_state",
        input_map=_same_names(("user_id", *USER_HISTORY_NAMES)),
        output_map={
            **{name: "_" + name for name in USER_HISTORY_NAMES},
            # the user tower reads no dwell
            **{RETRIEVAL_PREFIX + n: "_" + RETRIEVAL_PREFIX + n for n in _TOWER_HISTORY_NAMES},
            "served_post_ids": "_served_post_ids",
            **{s.name: "_" + s.name for s in IN_NETWORK_POSTS},
        },
    ),
    EnsembleStep(
        "user_encoder",
        input_map={
            "user_id": "user_id",
            **{n: "_" + RETRIEVAL_PREFIX + n for n in _TOWER_HISTORY_NAMES},
        },
        output_map={"user_embedding": "_user_embedding"},
    ),
    EnsembleStep(
        "retriever",
        input_map={
            "user_embedding": "_user_embedding",
            "top_k": "top_k",
            "history_post_ids": "_history_post_ids",
            "excluded_post_ids": "_served_post_ids",
            **{s.name: "_" + s.name for s in IN_NETWORK_POSTS},
        },
        output_map={
            "post_ids": "_candidate_post_ids",
            "author_ids": "_candidate_author_ids",
            "retrieval_scores": "_candidate_retrieval_scores",
            "post_age_seconds": "_candidate_post_age_seconds",
        },
    ),
    EnsembleStep(
        "ranker",
        input_map={
            "user_id": "user_id",
            **{name: "_" + name for name in USER_HISTORY_NAMES},
            "candidate_post_ids": "_candidate_post_ids",
            "candidate_author_ids": "_candidate_author_ids",
            "candidate_retrieval_scores": "_candidate_retrieval_scores",
            "candidate_post_age_seconds": "_candidate_post_age_seconds",
        },
        output_map={
            "ranked_post_ids": "_ranked_post_ids",
            "ranked_author_ids": "_ranked_author_ids",
            "action_probs": "_ranked_action_probs",
            "ranked_retrieval_scores": "_ranked_retrieval_scores",
            "ranked_post_age_seconds": "_ranked_post_age_seconds",
        },
    ),
    EnsembleStep(
        "feed_policy",
        input_map={
            "user_id": "user_id",
            "candidate_post_ids": "_ranked_post_ids",
            "candidate_author_ids": "_ranked_author_ids",
            "candidate_action_probs": "_ranked_action_probs",
            "candidate_retrieval_scores": "_ranked_retrieval_scores",
            "candidate_post_age_seconds": "_ranked_post_age_seconds",
            **_same_names(spec.name for spec in FEED_FILTERS),
            "in_network_post_ids": "_in_network_post_ids",
        },
        # the feed, under the names recommend answers it
        output_map={
            **_same_names(s.name for s in FEED_OUTPUTS if s.name != "retrieval_scores"),
            "ranked_retrieval_scores": "retrieval_scores",
        },
    ),
    EnsembleStep(
        "served_log",
        input_map={
            "user_id": "user_id",
            **{name: "_" + name for name in USER_HISTORY_NAMES},
            "sent_history_post_ids": "history_post_ids",
            "candidate_post_ids": "_candidate_post_ids",
            "candidate_author_ids": "_candidate_author_ids",
            "candidate_retrieval_scores": "_candidate_retrieval_scores",
            **_same_names(s.name for s in FEED_OUTPUTS),
        },
        output_map={REQUEST_ID.name: REQUEST_ID.name},
        side_effect=True,
    ),
)

# Parameters a chain's stages share, under their own names in the chain's config (one
# artifact directory, corpus and store for every stage); a stage's other parameters are named
# "<stage model>.<parameter>" there (``stage_parameter``).
SHARED_STAGE_PARAMETERS = (*ARTIFACT_PARAMETERS, CORPUS_FILE, USER_STATE_URL)
_SHARED_NAMES = frozenset(p.name for p in SHARED_STAGE_PARAMETERS)


def stage_parameter(model: str, name: str) -> str:
    """The chain config's name of parameter ``name`` of stage ``model``."""
    return name if name in _SHARED_NAMES else f"{model}.{name}"


def chain_parameters(stages: tuple[EnsembleStep, ...]) -> tuple[Parameter, ...]:
    """Every parameter of every stage, once: the shared ones, then each stage's own."""
    shared = {p.name for stage in stages for p in CONTRACTS[stage.model].parameters}
    declared = [p for p in SHARED_STAGE_PARAMETERS if p.name in shared]
    for stage in stages:
        for p in CONTRACTS[stage.model].parameters:
            if p.name not in _SHARED_NAMES:
                declared.append(dataclasses.replace(p, name=stage_parameter(stage.model, p.name)))
    return tuple(declared)


# The record flag of a chain request: 0 answers the feed without its side effects (no post
# marked served, no request log; request_id 0), as a rollout's shadow comparison asks.
RECORD = _spec("record", np.int8, [1], optional=True, values=Values(0, 1, "flags"))
_MODELS = (USER_STATE, USER_ENCODER, CANDIDATE_TOWER, RETRIEVER, RANKER, FEED_POLICY, SERVED_LOG)
CONTRACTS: dict[str, ModelContract] = {c.name: c for c in _MODELS}


# recommend's chain: every stage's service in one Python model, one batch at a time, each
# stage's outputs handed to the next in process (docs/architecture.md, "The recommend chain").
# It takes recommend's inputs and the record flag, and answers recommend's outputs.
def _ragged(spec: TensorSpec) -> TensorSpec:
    """``spec`` batched with requests of other lengths (it has a length axis)."""
    ragged = spec.length is not None
    return TensorSpec(spec.name, spec.dtype, spec.axes, spec.optional, ragged, spec.values)


RECOMMEND_CHAIN = ModelContract(
    name="recommend_chain",
    # ragged: requests with histories (or filters) of different lengths share a batch; the
    # chain's stages pad them (Triton batches only equal shapes otherwise: 1.7 requests a
    # batch were measured at c=16 with histories of several lengths)
    inputs=(*(_ragged(spec) for spec in RECOMMEND_INPUTS), RECORD),
    outputs=RECOMMEND_OUTPUTS,
    max_batch_size=8,
    stages=RECOMMEND_STAGES,
    parameters=chain_parameters(RECOMMEND_STAGES),
)

# What clients call: an ensemble of the chain, so that a rollout switches recommend from one
# version's chain to the next's in one ensemble load (phoenix.ops.rollout).
RECOMMEND = ModelContract(
    name="recommend",
    inputs=RECOMMEND_INPUTS,
    outputs=RECOMMEND_OUTPUTS,
    max_batch_size=8,
    backend=None,
    platform="ensemble",
    steps=(
        EnsembleStep(
            RECOMMEND_CHAIN.name,
            input_map=_same_names(s.name for s in RECOMMEND_INPUTS),
            output_map=_same_names(s.name for s in RECOMMEND_OUTPUTS),
        ),
    ),
)
CONTRACTS.update({c.name: c for c in (RECOMMEND_CHAIN, RECOMMEND)})

# The models that read the corpus (they declare corpus_file): a corpus switch moves them all.
CORPUS_READERS = tuple(n for n, c in CONTRACTS.items() if CORPUS_FILE.name in c.parameter_names)


def contract(model: str) -> ModelContract:
    """The contract of a served model by name."""
    try:
        return CONTRACTS[model]
    except KeyError:
        raise KeyError(f"no served model {model!r}; the models are {sorted(CONTRACTS)}") from None
