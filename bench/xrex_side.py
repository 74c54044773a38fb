"""X's own production ranker, run from X's release: one reference set per batch size, and
the time X's jitted forward takes on this process's device.

bench/bench_xrex.py runs this module in a process of its own, never imports it: X's modules
go on ``sys.path`` here and what its configs import unused is stubbed here
(harness/xrex_imports.py), neither of which may reach the process that runs our ranker.
Imports at the top: the standard library, numpy, harness.xrex_imports and
harness.call_timing; jax, haiku and X's modules after ``prepare_release``.

The forward is the non-packed serving path of X's ``RankingModelRunner``: ``hk.transform``
of ``model_config.make(...).forward(batch, embeddings)``, jitted, with the serving kernel
(``attn_impl=pallas_ranker_attn_infer``). Pallas has only its interpret mode on a CPU, so the
kernel runs interpreted there (slow: a CPU figure says nothing of X's speed) and compiled
(Triton) on a GPU. Each set is written in the layout ``phoenix.production.reference`` reads.

    python -m bench.xrex_side --release DIR --site DIR --out DIR --batches 1,8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.call_timing import milliseconds, timed_calls
from harness.xrex_imports import prepare_release, use_interpreted_kernels

CONFIG = "home_direct_packed_nano_offline_kafka_dump"
# X's inference launcher's and benchmark's serving overrides; the lengths are added per run.
SERVING_OVERRIDES = (
    "num_negatives_per_example=0",
    "num_global_negatives_per_example=0",
    "attn_impl=pallas_ranker_attn_infer",
    "use_seqpack=False",
    "right_anchored_rope=True",
)
NOW = 1_755_000_000  # impression time of the candidates (seconds)
DAY = 86_400


# --- the batch ----------------------------------------------------------------------------


def request_lengths(batch: int, history: int, candidates: int, rng) -> tuple[list, list]:
    """The first request full; the others shorter, as a serving batch mixes users."""
    hist = [history] + [int(rng.randint(history // 3, history + 1)) for _ in range(batch - 1)]
    cand = [candidates] + [
        int(rng.randint(candidates // 2, candidates + 1)) for _ in range(batch - 1)
    ]
    return hist, cand


def fill_sequence(seq, lengths, is_history: bool, codebook: int, rng) -> None:
    """Valid values in the first ``lengths[b]`` rows of request b; the rest stays padding."""
    from xrex.data.recsys.feature_config import CategoricalFeature as C

    for b, n in enumerate(lengths):
        seq["post_hashes"][b, :n] = rng.randint(1, 1 << 30, size=seq["post_hashes"][b, :n].shape)
        seq["auth_hashes"][b, :n] = rng.randint(1, 1 << 30, size=seq["auth_hashes"][b, :n].shape)
        seq["product_surface"][b, :n] = rng.randint(0, 16, size=n)
        age = rng.randint(0, 7 * DAY, size=n) if is_history else 0
        seq["impr_ts"][b, :n] = NOW - age
        seq["post_creation_ts_sec"][b, :n] = seq["impr_ts"][b, :n] - rng.randint(
            -600, 9 * DAY, size=n
        )
        categorical = seq["categorical_features"]
        categorical[b, :n, C.timezoneSeq] = rng.randint(0, 34, size=n)
        categorical[b, :n, C.localHourOfDaySeq] = rng.randint(0, 25, size=n)
        categorical[b, :n, C.localDayOfWeekSeq] = rng.randint(0, 8, size=n)
        seq["bool_features"][b, :n] = rng.rand(n, seq["bool_features"].shape[2]) < 0.3
        seq["int64_features"][b, :n] = rng.randint(
            -5, 100_000, size=seq["int64_features"][b, :n].shape
        )
        if seq.get("post_sids") is not None:
            sids = rng.randint(1, codebook + 1, size=seq["post_sids"][b, :n].shape)
            sids[::17] = 0  # posts without a semantic id
            seq["post_sids"][b, :n] = sids
        if is_history:
            actions = rng.rand(n, seq["actions"].shape[2]) < 0.05
            actions[:, 0] |= rng.rand(n) < 0.5
            seq["actions"][b, :n] = actions
            seq["continuous_actions"][b, :n, 1] = rng.exponential(8.0, size=n)


def fill_user(batch, rng) -> None:
    from xrex.data.recsys.feature_config import UserCategoricalFeature as UC
    from xrex.data.recsys.feature_config import UserFloatFeature as UF

    size = batch["user_hashes"].shape[0]
    batch["user_hashes"][:] = rng.randint(1, 1 << 30, size=batch["user_hashes"].shape)
    batch["user_ip_hashes"][:] = rng.randint(1, 1 << 30, size=batch["user_ip_hashes"].shape)
    categorical = batch["user_categorical_features"]
    for feature, values in (
        (UC.userCountryCode, 250),
        (UC.userLanguageCode, 200),
        (UC.userGender, 3),
        (UC.userInferredGender, 2),
        (UC.userAgeBracket, 10),
    ):
        categorical[:, feature] = rng.randint(0, values, size=size)
    floats = batch["user_float_features"]
    floats[:, UF.userLatitude] = rng.uniform(-60, 60, size=size)
    floats[:, UF.userLongitude] = rng.uniform(-180, 180, size=size)
    floats[:, UF.userInferredGenderScore] = rng.rand(size)
    floats[:, UF.userAgeInYears] = rng.uniform(15, 70, size=size)
    apps = batch["user_installed_apps_multihot"]
    apps[:] = rng.rand(*apps.shape) < 0.2


def embedding_slices(dataset, model_config, history: int, candidates: int) -> dict:
    """The merged rows' layout X's serving path gathers: history posts, history authors,
    candidate posts, candidate authors, user, user IP (each id's hashes in a row)."""
    table = dataset.hash_table
    widths = [
        ("hist_post", table.num_item_hashes * history),
        ("hist_auth", table.num_author_hashes * history),
        ("cand_post", table.num_item_hashes * candidates),
        ("cand_auth", table.num_author_hashes * candidates),
        ("user", table.num_user_hashes),
        ("user_ip", table.num_ip_hashes if model_config.use_ip_address else 0),
    ]
    slices, start = {}, 0
    for name, width in widths:
        slices[name] = [start, start + width]
        start += width
    return slices


def flatten(tree) -> tuple[dict, list]:
    """``a/b`` -> array of a nested batch or parameter tree; and the paths that were None."""
    import jax

    arrays, nones = {}, []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]:
        name = "/".join(str(_key_text(part)) for part in path)
        if leaf is None:
            nones.append(name)
        else:
            arrays[name] = np.asarray(leaf)
    return arrays, nones


def _key_text(part):
    for attribute in ("key", "name", "idx"):
        if hasattr(part, attribute):
            return getattr(part, attribute)
    return part


# --- X's forward --------------------------------------------------------------------------


def serving_overrides(history: int, candidates: int) -> list[str]:
    return [
        *SERVING_OVERRIDES,
        f"history_seq_len={history}",
        f"candidate_seq_len={candidates}",
        f"model_config.model_config.sequence_len={history + candidates + 2}",
    ]


def overrides_of(set_json: Path, history: int, candidates: int) -> list[str]:
    """A reference set's overrides (its model and shapes), checked against the shapes asked."""
    meta = json.loads(set_json.read_text())
    if (meta["history_seq_len"], meta["candidate_seq_len"]) != (history, candidates):
        raise SystemExit(f"error: {set_json} is history {meta['history_seq_len']} x "
                         f"{meta['candidate_seq_len']}, not {history} x {candidates}")  # fmt: skip
    return list(meta["overrides"])


def build_trainer(overrides: list[str]):
    import xai_configlib
    import xrex.configs.xrecsys as xrecsys
    from xrex.configs.config_loader import PRESETS

    trainer, used = xai_configlib.replace_cli_subs(xrecsys.CONFIGS[CONFIG], overrides, PRESETS)
    unused = [key for key, value in used.items() if not value]
    if unused:
        raise SystemExit(f"error: X's config took no override for {unused}")
    return trainer


def forward_program(trainer, slices: dict, mesh):
    import haiku as hk
    import jax
    import jax.numpy as jnp
    from xrex.models.recsys_embedding import RecsysEmbeddings
    from xrex.models.sharding_context import make_legacy_sharding_context

    model_config = trainer.model_config

    def rows(merged, name):
        start, stop = slices[name]
        return merged[:, start:stop, :] if stop > start else None

    def forward(batch, merged):  # merged: [B, rows, table width] bfloat16
        embeddings = RecsysEmbeddings(
            history_post_embeddings=rows(merged, "hist_post"),
            history_author_embeddings=rows(merged, "hist_auth"),
            candidate_post_embeddings=rows(merged, "cand_post"),
            candidate_author_embeddings=rows(merged, "cand_auth"),
            user_embeddings=rows(merged, "user"),
            user_ip_embeddings=rows(merged, "user_ip"),
        )
        model = model_config.make(sharding_context=make_legacy_sharding_context(mesh))
        logits, continuous = model.forward(batch, embeddings)  # [B, R, 64], [B, R, 8]
        log_probs = jax.nn.log_sigmoid(logits).astype(jnp.float32)
        return log_probs, logits.astype(jnp.float32), continuous.astype(jnp.float32)

    return hk.transform(forward)


def make_mesh():
    import jax
    from jax.experimental import mesh_utils
    from xrex.train.parallel_config import ParallelConfig

    parallel = ParallelConfig(ep=1, dp=1)
    # One device: X's serving mesh is (1, ep=1, dp=1, 1, 1, 1) whatever the machine holds.
    devices = mesh_utils.create_device_mesh(parallel.mesh_shape(), jax.devices()[:1])
    return jax.sharding.Mesh(devices, parallel.mesh_axis_names())


def mesh_context(mesh):
    """The mesh as X's runner enters it (``with mesh:``), in the form the JAX here takes:
    ``jax.set_mesh`` where it exists (``with mesh:`` is deprecated from JAX 0.10 on)."""
    import jax

    return jax.set_mesh(mesh) if hasattr(jax, "set_mesh") else mesh


class XForward:
    """X's model for one config: its forward program, mesh and merged-row layout."""

    def __init__(self, overrides: list[str], history: int, candidates: int) -> None:
        import jax

        self.overrides = overrides
        self.trainer = build_trainer(overrides)
        if jax.default_backend() == "cpu":
            use_interpreted_kernels()
        self.mesh = make_mesh()
        self.dataset, self.model_config = self.trainer.dataset, self.trainer.model_config
        self.history, self.candidates = history, candidates
        self.slices = embedding_slices(self.dataset, self.model_config, history, candidates)
        self.rows = max(stop for _, stop in self.slices.values())
        self.program = forward_program(self.trainer, self.slices, self.mesh)

    def init(self, seed: int):
        """X's initial parameters, rounded to bfloat16 as X's forward reads them (so a
        written file holds what it ran)."""
        import jax
        import jax.numpy as jnp

        merged = jnp.zeros((1, self.rows, self.model_config.emb_table_width), jnp.bfloat16)
        with mesh_context(self.mesh):
            params = self.program.init(
                jax.random.PRNGKey(seed), self.dataset.example_data(1), merged
            )
        return jax.tree.map(lambda p: jnp.asarray(p, jnp.bfloat16).astype(jnp.float32), params)

    def run(self, params, batch, merged, repeats: int) -> tuple[dict, tuple]:
        """Compile, then ``repeats`` timed calls (inputs from the host, outputs to it)."""
        import jax

        apply_rng = jax.random.PRNGKey(0)  # X's layer stack asks for an rng at apply time
        with mesh_context(self.mesh):
            started = time.perf_counter()
            compiled = jax.jit(self.program.apply).lower(params, apply_rng, batch, merged).compile()
            compile_s = time.perf_counter() - started
            first, seconds, outputs = timed_calls(
                lambda: compiled(params, apply_rng, batch, merged), repeats
            )
        timing = {
            "compile_s": round(compile_s, 2),
            "first_call_s": round(first, 3),
            **milliseconds(seconds),
            "finite": bool(all(np.isfinite(o).all() for o in outputs)),
        }
        return timing, outputs


def write_set(
    out: Path, name: str, x: XForward, batch, merged, params, outputs, lengths, seed
) -> None:
    """A reference set in the layout ``phoenix.production.reference`` reads."""
    log_probs, logits, continuous = outputs
    inputs, nones = flatten(batch)
    arrays: dict[str, Any] = {f"in/{key}": value for key, value in inputs.items()}
    arrays["in/merged_embeddings_bf16_as_uint16"] = np.asarray(merged).view(np.uint16)
    arrays.update({"out/log_probs": log_probs, "out/logits": logits})
    arrays["out/continuous_predictions"] = continuous
    arrays["seed"] = np.int64(seed)
    arrays["hist_len"], arrays["cand_len"] = np.array(lengths[0]), np.array(lengths[1])
    np.savez(out / f"{name}.npz", **arrays)
    meta = {
        "config": CONFIG,
        "overrides": x.overrides,
        "seed": seed,
        "batch": len(lengths[0]),
        "history_seq_len": x.history,
        "candidate_seq_len": x.candidates,
        "embedding_slices": x.slices,
        "none_batch_fields": nones,
    }
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    params_arrays: dict[str, Any] = flatten(params)[0]
    np.savez(out / f"{name}_params.npz", **params_arrays)


def run_generated(args, x: XForward, params, size: int) -> dict:
    """A batch of ``size`` requests with valid random values, X's forward timed, the set
    written as ``x_bSIZE``."""
    import jax.numpy as jnp

    rng = np.random.RandomState(args.input_seed + size)
    batch = x.dataset.example_data(size)
    lengths = request_lengths(size, x.history, x.candidates, rng)
    codebook = x.model_config.sid_codebook_size
    fill_sequence(batch["history_seq"], lengths[0], True, codebook, rng)
    fill_sequence(batch["candidate_seq"], lengths[1], False, codebook, rng)
    fill_user(batch, rng)
    width = x.model_config.emb_table_width
    # On the host, as X's serving path gathers them and as ours gets them: copied each call.
    merged = (rng.standard_normal((size, x.rows, width)) * 0.02).astype(jnp.bfloat16)
    timing, outputs = x.run(params, batch, merged, args.repeats)
    name = f"x_b{size}"
    write_set(args.out, name, x, batch, merged, params, outputs, lengths, args.seed)
    return {"set": name, "batch": size, **timing}


def run_replay(args, data_path: Path) -> dict:
    """A stored reference set's inputs and parameters through X's forward here; the set
    written again with these outputs."""
    import jax
    import jax.numpy as jnp

    meta = json.loads(data_path.with_suffix(".json").read_text())
    x = XForward(list(meta["overrides"]), meta["history_seq_len"], meta["candidate_seq_len"])
    with np.load(data_path) as npz:
        arrays = {key: np.asarray(npz[key]) for key in npz.files}
    size = len(arrays["hist_len"])
    batch = x.dataset.example_data(size)
    for key, value in arrays.items():
        if key.startswith("in/") and not key.startswith("in/merged_embeddings"):
            *parents, leaf = key[len("in/") :].split("/")
            node = batch
            for parent in parents:
                node = node[parent]
            node[leaf][...] = value
    merged = arrays["in/merged_embeddings_bf16_as_uint16"].view(jnp.bfloat16)  # on the host
    template = x.init(0)
    with np.load(data_path.with_name(data_path.stem + "_params.npz")) as stored:
        names = list(flatten(template)[0])
        if sorted(names) != sorted(stored.files):
            raise SystemExit(f"error: {data_path.stem}_params.npz does not hold X's parameters")
        leaves = [jnp.asarray(stored[name]) for name in names]
    params = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)
    timing, outputs = x.run(params, batch, merged, args.repeats)
    lengths = (arrays["hist_len"].tolist(), arrays["cand_len"].tolist())
    write_set(
        args.out, data_path.stem, x, batch, merged, params, outputs, lengths, int(arrays["seed"])
    )
    return {"set": data_path.stem, "batch": size, **timing}


def x_gpu_arch() -> str:
    """The device X's code believes it runs on (it picks its attention kernel by it)."""
    from xrex.utils.gpu import gpu_arch

    return gpu_arch().name


def kernel_name(arch: str, backend: str) -> str:
    """X's serving attention as its ``PallasRankerAttentionInference`` picks it: the
    Mosaic GPU kernel (``ranker_attention_fa3``) on an H100, the Triton one
    (``ranker_attention_v2``) elsewhere; interpreted on a CPU."""
    if backend == "cpu":
        return "ranker_attention_v2, Pallas interpret mode"
    if arch == "H100":
        return "ranker_attention_fa3, Pallas Mosaic GPU"
    return "ranker_attention_v2, Pallas Triton"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m bench.xrex_side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--release", type=Path, required=True, help="the phoenix/ folder of X's release")
    add("--site", type=Path, required=True, help="the folder with the generated xai_proto")
    add("--out", type=Path, required=True, help="where the sets and timings.json go")
    add("--batches", help="comma-separated batch sizes (all but --replay)")
    add("--history", type=int, help="history length (all but --replay)")
    add("--candidates", type=int, help="candidates a request (all but --replay)")
    add("--overrides-from", type=Path, metavar="SET.json",
        help="the model of a reference set (its overrides) instead of the nano's")  # fmt: skip
    add(
        "--replay",
        type=Path,
        metavar="SET.npz",
        help="instead: a stored reference set's inputs and parameters, run again",
    )
    add("--repeats", type=int, required=True, help="timed calls a batch")
    add("--seed", type=int, default=20260821, help="X's init seed (default: %(default)s)")
    add("--input-seed", type=int, default=7, help="(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.replay is None and None in (args.batches, args.history, args.candidates):
        parser.error("--batches, --history and --candidates, or --replay")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    finder = prepare_release(args.release, args.site)
    import jax

    if args.replay is not None:
        rows = [run_replay(args, args.replay)]
    else:
        overrides = (
            serving_overrides(args.history, args.candidates)
            if args.overrides_from is None
            else overrides_of(args.overrides_from, args.history, args.candidates)
        )
        x = XForward(overrides, args.history, args.candidates)
        params = x.init(args.seed)
        sizes = [int(part) for part in args.batches.split(",")]
        rows = [run_generated(args, x, params, size) for size in sizes]
    timings = {
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "gpu_arch": x_gpu_arch(),
        "kernel": kernel_name(x_gpu_arch(), jax.default_backend()),
        "jax": jax.__version__,
        "stubbed": sorted({name.partition(".")[0] for name in finder.stubbed}),
        "rows": rows,
    }
    (args.out / "timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    for row in rows:
        print(
            f"X's forward, {row['set']} (batch {row['batch']}): {row['median_ms']:.2f} ms "
            f"(median of {len(row['ms'])}), compile {row['compile_s']:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
