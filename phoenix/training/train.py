"""Training of both Phoenix towers with optax (jax, haiku, optax and numpy only).

Both towers share one set of hash embedding tables (the artifact layout has one
``embedding_tables.npz``), so they train together: each step adds

- the retrieval loss: in-batch sampled softmax of user vectors against the candidate-tower
  vectors of each row's positive post, with the log-q correction of in-batch sampling and
  the temperature ``exp(~/log_temperature)`` (the checkpoint's training scalar), and rows of
  the same post masked as negatives;
- the ranker loss: per-action binary cross-entropy (each action's mean over real candidates,
  summed over the 19 actions) plus the mean absolute error of the continuous dwell head
  (``continuous_preds[..., DWELL_TIME_INDEX]`` against dwell seconds normalised as the model
  normalises history dwell).

The ranker is the served ``PhoenixModel`` on [user, history, candidates] with candidate
isolation; with ``right_anchored_rope`` every candidate sits at the same RoPE position, so a
candidate's score depends neither on the other candidates nor on its slot, in training as in
serving.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

from phoenix import checkpoint
from phoenix.artifact_parts import random_params, stream
from phoenix.config import ArtifactConfig
from phoenix.recsys_model import (
    DWELL_TIME_INDEX,
    NUM_CONTINUOUS,
    NormConfig,
    RecsysBatch,
    RecsysEmbeddings,
    normalize_continuous_value,
)
from phoenix.recsys_retrieval_model import INF

TABLE_INIT_STD = 0.05
MIN_LOG_TEMPERATURE = float(np.log(0.02))
INITIAL_LOG_TEMPERATURE = float(np.log(0.1))
TOWERS = ("retrieval", "ranker")


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings of one training run."""

    steps: int
    ranker_batch: int = 64  # feed requests per step
    retrieval_batch: int = 256  # (history, positive) pairs per step
    num_candidates: int = 16  # candidate slots of a ranker training request
    learning_rate: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 1e-5
    seed: int = 0
    towers: tuple[str, ...] = TOWERS
    frozen: tuple[str, ...] = ()  # parameter groups ('tables', 'ranker', 'retrieval') kept fixed

    def trained_groups(self) -> tuple[str, ...]:
        """Parameter groups this run updates: its towers and the shared tables, less
        ``frozen``; the other tower's weights are left bit for bit as they are."""
        return tuple(g for g in (*self.towers, "tables") if g not in self.frozen)


# ----------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------


def init_params(config: ArtifactConfig, seed: int) -> dict:
    """Starting point: the seeded random weights of ``phoenix.artifacts`` for both models,
    small random hash tables (row 0 unused, zero) and the initial temperature."""
    ranker = random_params(checkpoint.ranker_param_shapes(config), seed, "ranker")
    retrieval = random_params(checkpoint.retrieval_param_shapes(config), seed, "retrieval")
    retrieval["~"]["log_temperature"] = np.float32(INITIAL_LOG_TEMPERATURE)
    tables = {}
    for entity in ("user", "item", "author"):
        rng = stream(seed, "train-table", entity)
        table = rng.standard_normal((config.vocab_size(entity), config.emb_size), np.float32)
        table *= np.float32(TABLE_INIT_STD)
        table[0] = 0.0
        tables[entity] = table
    return {"ranker": ranker, "retrieval": retrieval, "tables": tables}


def artifact_tables(params: dict) -> dict[str, np.ndarray]:
    """The three hash tables under their ``embedding_tables.npz`` keys."""
    return {
        f"{entity}_embeddings": np.asarray(params["tables"][entity], np.float32)
        for entity in ("user", "item", "author")
    }


def numpy_tree(tree):
    return jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), tree)


# ----------------------------------------------------------------------------------------
# Model inputs
# ----------------------------------------------------------------------------------------


def lookup(table: jax.Array, hashes: jax.Array) -> jax.Array:
    """Rows of ``table`` for ``hashes`` [...] -> [..., D]; hash 0 (padding) gives zeros."""
    return jnp.take(table, hashes, axis=0) * (hashes > 0)[..., None].astype(table.dtype)


# The batch fields training reads from a logged batch unchanged.
USER_AND_HISTORY = (
    "user_hashes",
    "history_post_hashes",
    "history_author_hashes",
    "history_actions",
    "history_product_surface",
)


def model_inputs(tables: dict, arrays: dict, with_candidates: bool = True):
    """``RecsysBatch`` and ``RecsysEmbeddings`` of a batch dict (``phoenix.training.data``)."""
    batch_size, seq = arrays["history_product_surface"].shape
    continuous = jnp.zeros((batch_size, seq, NUM_CONTINUOUS), jnp.float32)
    continuous = continuous.at[:, :, DWELL_TIME_INDEX].set(arrays["history_dwell_seconds"])
    if with_candidates:
        cand_post, cand_author = arrays["candidate_post_hashes"], arrays["candidate_author_hashes"]
        surface = arrays["candidate_product_surface"]
        impr, created = arrays["candidate_impr_ts"], arrays["candidate_post_creation_ts"]
    else:
        cand_post = arrays["positive_post_hashes"][:, None, :]
        cand_author = arrays["positive_author_hashes"][:, None, :]
        surface = jnp.zeros((batch_size, 1), jnp.int32)
        impr = created = None
    batch = RecsysBatch(
        **{name: arrays[name] for name in USER_AND_HISTORY},  # as the batch holds them
        candidate_post_hashes=cand_post,
        candidate_author_hashes=cand_author,
        candidate_product_surface=surface,
        history_continuous_actions=continuous,
        candidate_impr_ts=impr,
        candidate_post_creation_ts=created,
    )
    embeddings = RecsysEmbeddings(
        user_embeddings=lookup(tables["user"], arrays["user_hashes"]),
        history_post_embeddings=lookup(tables["item"], arrays["history_post_hashes"]),
        candidate_post_embeddings=lookup(tables["item"], cand_post),
        history_author_embeddings=lookup(tables["author"], arrays["history_author_hashes"]),
        candidate_author_embeddings=lookup(tables["author"], cand_author),
    )
    return batch, embeddings


# ----------------------------------------------------------------------------------------
# Forward functions and losses
# ----------------------------------------------------------------------------------------


def ranker_apply(config: ArtifactConfig) -> Callable:
    """(params, batch, embeddings) -> RecsysModelOutput of the served ranking model."""
    model_config = config.ranker_config(jnp.float32)
    return hk.without_apply_rng(hk.transform(lambda b, e: model_config.make()(b, e))).apply


def retrieval_apply(config: ArtifactConfig) -> Callable:
    """(params, batch, embeddings) -> (user vectors [B, D], candidate vectors [B, C, D])."""
    model_config = config.retrieval_config(jnp.float32)

    def forward(batch, embeddings):
        model = model_config.make()
        users, _ = model.build_user_representation(batch, embeddings)
        candidates, _ = model.build_candidate_representation(batch, embeddings)
        return users, candidates

    return hk.without_apply_rng(hk.transform(forward)).apply


def ranker_loss(config: ArtifactConfig) -> Callable:
    apply = ranker_apply(config)
    norm = NormConfig()

    def loss_fn(params, tables, arrays):
        batch, emb = model_inputs(tables, arrays)
        out = apply(params, batch, emb)
        mask = arrays["candidate_mask"].astype(jnp.float32)  # [B, C]
        count = jnp.maximum(mask.sum(), 1.0)
        bce = optax.sigmoid_binary_cross_entropy(out.logits.astype(jnp.float32), arrays["labels"])
        per_action = jnp.sum(bce * mask[..., None], axis=(0, 1)) / count  # [A]
        dwell = normalize_continuous_value(arrays["dwell_labels"], norm)
        dwell_pred = out.continuous_preds[..., DWELL_TIME_INDEX].astype(jnp.float32)
        dwell_mae = jnp.sum(jnp.abs(dwell_pred - dwell) * mask) / count
        return per_action.sum() + dwell_mae, {"ranker": per_action.sum(), "dwell_mae": dwell_mae}

    return loss_fn


def retrieval_loss(config: ArtifactConfig) -> Callable:
    apply = retrieval_apply(config)

    def loss_fn(params, tables, arrays):
        batch, emb = model_inputs(tables, arrays, with_candidates=False)
        users, candidates = apply(params, batch, emb)
        candidates = candidates[:, 0]  # [B, D]
        log_t = jnp.maximum(params["~"]["log_temperature"], MIN_LOG_TEMPERATURE)
        logits = users @ candidates.T / jnp.exp(log_t)  # [B, B]
        logits = logits - arrays["positive_logq"][None, :]  # log-q correction
        post = arrays["positive_post_index"]
        same = (post[:, None] == post[None, :]) & ~jnp.eye(post.shape[0], dtype=bool)
        logits = jnp.where(same, -INF, logits)
        labels = jnp.arange(post.shape[0])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, {"retrieval": loss, "temperature": jnp.exp(log_t)}

    return loss_fn


def make_optimizer(settings: TrainSettings) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        settings.learning_rate,
        min(settings.warmup_steps, max(settings.steps - 1, 1)),
        max(settings.steps, 2),
        end_value=settings.learning_rate * 0.1,
    )
    adam = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, weight_decay=settings.weight_decay),
    )
    trained = set(settings.trained_groups())
    # AdamW's decoupled decay moves parameters that get no gradient, so every group outside
    # this phase is kept exactly as it is (and needs no optimiser state)
    labels = lambda params: {k: "train" if k in trained else "fixed" for k in params}  # noqa: E731
    return optax.multi_transform({"train": adam, "fixed": optax.set_to_zero()}, labels)


def make_train_step(config: ArtifactConfig, optimizer, towers: Iterable[str] = TOWERS):
    """Jitted (params, opt_state, batches) -> (params, opt_state, metrics)."""
    towers = tuple(towers)
    losses = {}
    if "retrieval" in towers:
        losses["retrieval"] = retrieval_loss(config)
    if "ranker" in towers:
        losses["ranker"] = ranker_loss(config)

    def total_loss(params, batches):
        total, metrics = 0.0, {}
        for tower, loss_fn in losses.items():
            loss, extra = loss_fn(params[tower], params["tables"], batches[tower])
            total = total + loss
            metrics.update(extra)
        return total, metrics

    def step(params, opt_state, batches):
        (loss, metrics), grads = jax.value_and_grad(total_loss, has_aux=True)(params, batches)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["loss"] = loss
        return params, opt_state, metrics

    return jax.jit(step, donate_argnums=(0, 1))


def make_eval_loss(config: ArtifactConfig, towers: Iterable[str] = TOWERS):
    """Jitted (params, batches) -> metrics, for held-out loss curves."""
    fns = {"retrieval": retrieval_loss(config), "ranker": ranker_loss(config)}

    def evaluate(params, batches):
        metrics = {}
        for tower in towers:
            metrics.update(fns[tower](params[tower], params["tables"], batches[tower])[1])
        return metrics

    return jax.jit(evaluate)


# ----------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------


@dataclass
class History:
    """Learning curves: per-step training metrics and periodic held-out metrics."""

    steps: list = field(default_factory=list)
    train: dict = field(default_factory=dict)  # name -> list over ``steps``
    eval_steps: list = field(default_factory=list)
    eval: dict = field(default_factory=dict)
    seconds: float = 0.0
    compile_seconds: float = 0.0
    examples: dict = field(default_factory=dict)  # tower -> examples seen

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "train": self.train,
            "eval_steps": self.eval_steps,
            "eval": self.eval,
            "seconds": self.seconds,
            "compile_seconds": self.compile_seconds,
            "examples": self.examples,
        }


def _append(store: dict, metrics: dict) -> None:
    for key, value in metrics.items():
        store.setdefault(key, []).append(float(value))


def train(
    config: ArtifactConfig,
    params: dict,
    next_batches: Callable[[int], dict],
    settings: TrainSettings,
    eval_batches: Optional[dict] = None,
    eval_every: int = 100,
    log_every: int = 10,
    progress: Optional[Callable] = None,
) -> tuple[dict, History]:
    """Run ``settings.steps`` steps; ``next_batches(step)`` gives {tower: batch dict}.

    ``progress(step, metrics, examples_per_s)`` is called every ``log_every`` steps (the CLI
    drives a tqdm bar with it). Returns the trained parameters (numpy) and the curves.
    """
    optimizer = make_optimizer(settings)
    step_fn = make_train_step(config, optimizer, settings.towers)
    eval_fn = make_eval_loss(config, settings.towers) if eval_batches is not None else None
    params = jax.tree_util.tree_map(jnp.asarray, params)
    opt_state = optimizer.init(params)
    history = History()
    per_step = {
        "retrieval": settings.retrieval_batch if "retrieval" in settings.towers else 0,
        "ranker": settings.ranker_batch if "ranker" in settings.towers else 0,
    }
    started = time.perf_counter()
    window_start, window_examples = started, 0  # the window restarts after step 0 (compile)
    for step in range(settings.steps):
        if eval_fn is not None and step % eval_every == 0:
            history.eval_steps.append(step)
            _append(history.eval, jax.device_get(eval_fn(params, eval_batches)))
        batches = next_batches(step)
        params, opt_state, metrics = step_fn(params, opt_state, batches)
        if step == 0:
            jax.block_until_ready(metrics["loss"])
            history.compile_seconds = time.perf_counter() - started
            window_start = time.perf_counter()
            continue
        window_examples += sum(per_step.values())
        if step % log_every == 0 or step == settings.steps - 1:
            metrics = jax.device_get(metrics)
            history.steps.append(step)
            _append(history.train, metrics)
            rate = window_examples / max(time.perf_counter() - window_start, 1e-9)
            if progress is not None:
                progress(step, metrics, rate)
    if eval_fn is not None:
        history.eval_steps.append(settings.steps)
        _append(history.eval, jax.device_get(eval_fn(params, eval_batches)))
    jax.block_until_ready(params)
    history.seconds = time.perf_counter() - started
    history.examples = {k: v * settings.steps for k, v in per_step.items() if v}
    return numpy_tree(params), history
