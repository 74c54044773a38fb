"""Writes a tiny xrex ranking checkpoint with X's own trainer code (README.md here says how).

Runs in the upstream release's Python environment, never the project's (jax 0.8.1,
orbax-checkpoint 0.9.1, the release's packages on PYTHONPATH); the project only reads what it
wrote. usage:

    PYTHONPATH=<release>/phoenix:<release packages> python make_checkpoint.py OUT_DIR
"""

# ruff: noqa: E402  (the stand-ins below must be in place before the release's imports)

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import types
import typing

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import typing_extensions

# xai_configlib names typing.TypeAliasType (Python 3.12) though the venv runs 3.11.
if not hasattr(typing, "TypeAliasType"):
    typing.TypeAliasType = typing_extensions.TypeAliasType


class _Anything(type):
    """A stand-in class for serving-only packages the config modules import but never call."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})

    def __call__(cls, *args, **kwargs):
        return _Anything("instance", (), {})

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __getitem__(cls, item):
        return cls


class _StubPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    ROOTS = {"xai_recsys_engine", "aiokafka", "opentelemetry", "prometheus_client"}

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: _Anything(name, (), {})
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubPackages())

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import xai_configlib
import xrex.configs.xrecsys as xrecsys
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from xai_checkpointing import checksum
from xrex.configs.config_loader import PRESETS
from xrex.data.recsys.constants import engagement_to_ids
from xrex.models.model_utils import Parameter, unwrap_tree
from xrex.models.recsys_embedding import RecsysEmbeddings
from xrex.models.recsys_model import build_metric_masks
from xrex.models.sharding_context import make_legacy_sharding_context
from xrex.pallas import ranker_attention_v2
from xrex.train import checkpoint_write
from xrex.train.misc import PostEmbeddings, RecsysTrainingState
from xrex.train.parallel_config import ParallelConfig
from xrex.train.trainer_recsys import RecsysTrainer, _deep_filter_nones
from xrex.utils import checkpointing
from xrex.utils.metadata import FileSystemProvider, MetadataManager

CONFIG = "home_direct_packed_nano_offline_kafka_dump"
# The nano ranker shrunk to a few kilobytes of weights (every parameter name kept).
OVERRIDES = [
    "num_negatives_per_example=0",
    "num_global_negatives_per_example=0",
    "history_seq_len=14",
    "candidate_seq_len=4",
    "attn_impl=pallas_ranker_attn_infer",
    "use_seqpack=False",
    "right_anchored_rope=True",
    "model_config.model_config.sequence_len=20",
    "emb_size=16",
    "emb_table_width=32",
    "num_layers=2",
    "key_size=64",
    "num_q_heads=2",
    "num_kv_heads=1",
    "sid_embed_dim=8",
    "smoothing_windows=",
]
SEED = 20260821
EMB_TABLE_ROWS = 128
ELAPSED_SAMPLES = 4096
STEP = 64


def interpret_pallas():
    """The ranker's Pallas kernels run only in interpret mode on a CPU."""
    ranker_attention_v2.mha_inference_gqa = functools.partial(
        ranker_attention_v2.mha_inference_gqa, interpret=True
    )
    kernel = ranker_attention_v2.mha

    def mha(*args, **kwargs):
        kwargs["interpret"] = True
        return kernel(*args, **kwargs)

    ranker_attention_v2.mha = mha


def init_params(trainer, mesh):
    """The ranking model's Haiku parameters, each a Parameter, as the trainer initialises them."""
    mc, ds = trainer.model_config, trainer.dataset
    ht = ds.hash_table
    H, C = ds.history_seq_len, ds.candidate_seq_len
    ends = np.cumsum(
        [
            ht.num_item_hashes * H,
            ht.num_author_hashes * H,
            ht.num_item_hashes * C,
            ht.num_author_hashes * C,
            ht.num_user_hashes,
            ht.num_ip_hashes if mc.use_ip_address else 0,
        ]
    )

    @hk.transform
    def forward(batch, merged):
        s1, s2, s3, s4, s5, s6 = (int(e) for e in ends)
        embeddings = RecsysEmbeddings(
            history_post_embeddings=merged[:, :s1],
            history_author_embeddings=merged[:, s1:s2],
            candidate_post_embeddings=merged[:, s2:s3],
            candidate_author_embeddings=merged[:, s3:s4],
            user_embeddings=merged[:, s4:s5],
            user_ip_embeddings=merged[:, s5:s6] if s6 > s5 else None,
        )
        model = mc.make(sharding_context=make_legacy_sharding_context(mesh))
        return model.forward(batch, embeddings)

    batch = ds.example_data(1)
    merged = jnp.zeros((1, int(ends[-1]), mc.emb_table_width), mc.embedding_dtype)
    with mesh:
        return forward.init(jax.random.PRNGKey(SEED), batch, merged)


def ema_keys(trainer):
    """The names RecsysTrainer.init gives its rce_ema / calib_ema entries."""
    mc = trainer.model_config
    dummy = jnp.zeros((1, 1))
    masks = build_metric_masks(
        dummy,
        jnp.zeros((1, 1, mc.model_config.output_vocab_size)),
        dummy,
        dummy,
        enable_platform_metrics=mc.enable_platform_metrics,
        split_head_training_by_source=mc.split_head_training_by_source,
        metric_mask_keys=mc.metric_mask_keys,
    )
    return [
        f"{e}/{m}/{w}"
        for e in engagement_to_ids(mc.metric_group)
        for m in masks
        for w in trainer.smoothing_windows
    ]


def training_state(trainer, mesh):
    """A RecsysTrainingState with the fields RecsysTrainer.init fills, small."""
    mc = trainer.model_config
    params = init_params(trainer, mesh)
    optim = trainer.optim_config.make()
    rng = jax.random.PRNGKey(SEED + 1)
    emb_table, emb_table_state = mc.make_embedding_table(rng, optim, EMB_TABLE_ROWS, True)
    if trainer.emb_optim_config._active() == "rowwise_adagrad":
        emb_table_state = trainer.emb_optim_config.make_optimizer(optim).init({"table": emb_table})
    emb_table = Parameter(x=emb_table.x.at[0, :].set(0), **emb_table.fields)
    # RecsysTrainer.init keeps no metric EMAs when smoothing_windows is empty (as here).
    keys = ema_keys(trainer) if trainer.smoothing_windows else None
    return RecsysTrainingState(
        params=params,
        opt_state=optim.init(params),
        rng=jax.random.PRNGKey(SEED + 2),
        step=jnp.array(STEP),
        emb_table=emb_table,
        emb_table_state=emb_table_state,
        offset_keys=jnp.array([-1]),
        offset_values=jnp.array([-1]),
        post_embeddings=PostEmbeddings(
            post_ids=jnp.arange(1).astype(jnp.int32),
            author_ids=jnp.arange(1).astype(jnp.int32),
            embeddings=Parameter(x=jnp.zeros((1, 1), jnp.bfloat16), pspec=P(None, None)),
            dataset_types=jnp.zeros((1,), jnp.int32),
        ),
        rce_ema=None if keys is None else {k: jnp.zeros((3,), jnp.float32) for k in keys},
        calib_ema=None if keys is None else {k: jnp.zeros((2,), jnp.float32) for k in keys},
    )


def shardings(state, mesh):
    """Each leaf's NamedSharding: a Parameter's own pspec, replicated otherwise."""

    def sharding(leaf):
        spec = leaf.pspec if isinstance(leaf, Parameter) else P()
        return NamedSharding(mesh, spec)

    return jax.tree.map(sharding, state, is_leaf=lambda x: isinstance(x, Parameter))


@dataclasses.dataclass
class _Saver:
    """What checkpoint_write.save_checkpoint and RecsysTrainer.checksum_dict read of a trainer."""

    state: typing.Any
    mesh: typing.Any
    model_config: typing.Any
    checkpoint_config: typing.Any
    ctx: typing.Any
    elapsed_samples: int
    elapsed_tokens: int
    current_ckpt_index: int
    _filtered_sharding: typing.Any
    _compute_checksums_filtered_jit: typing.Any = None

    get_checkpoint_path = checkpoint_write.get_checkpoint_path
    checksum_dict = RecsysTrainer.checksum_dict


def main(out_dir):
    trainer, used = xai_configlib.replace_cli_subs(xrecsys.CONFIGS[CONFIG], OVERRIDES, PRESETS)
    assert all(used.values()), used
    interpret_pallas()
    pc = ParallelConfig(ep=1, dp=1)
    mesh = jax.sharding.Mesh(mesh_utils.create_device_mesh(pc.mesh_shape()), pc.mesh_axis_names())

    state = training_state(trainer, mesh)
    state_sharding = shardings(state, mesh)
    state = jax.device_put(state, state_sharding)

    # The run's metadata as Trainer.run records it: config.json is the run's config.
    checkpoint_config = dataclasses.replace(trainer.checkpoint_config, checkpoint_dir=out_dir)
    meta = MetadataManager([FileSystemProvider(out_dir)])
    run, _ = meta.init_run(trainer.name, trainer)

    # The trainer's own save: RecsysTrainer.checksum_dict, checkpoint_write.save_checkpoint.
    saver = _Saver(
        state=state,
        mesh=mesh,
        model_config=trainer.model_config,
        checkpoint_config=checkpoint_config,
        ctx=types.SimpleNamespace(run=run, meta=meta),
        elapsed_samples=ELAPSED_SAMPLES,
        elapsed_tokens=ELAPSED_SAMPLES * 20,
        current_ckpt_index=0,
        _filtered_sharding=_deep_filter_nones(state_sharding),
    )
    saver._compute_checksums_filtered_jit = jax.jit(
        lambda s: checksum.compute_checksums(s, unwrap_tree(saver._filtered_sharding), mesh),
        in_shardings=(unwrap_tree(saver._filtered_sharding),),
    )
    with mesh:
        checkpoint_write.save_checkpoint(saver, blocking=True)
    checkpointing.get_checkpointer().close()

    # The expected arrays, named from the saved state itself: each Haiku parameter by its path
    # through {module: {name: Parameter}} ('<module>/<name>/0', 0 the Parameter's leaf).
    expected = {
        "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path): np.asarray(leaf)
        for key_path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
    }
    expected["emb_table"] = np.asarray(state.emb_table.x)
    expected["step"] = np.asarray(state.step)
    np.savez(os.path.join(out_dir, "expected.npz"), **expected)
    print("wrote", run.checkpoint_path(out_dir, ELAPSED_SAMPLES), "and expected.npz")


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]))
