"""The published reference outputs (tests/data/golden_public.npz, copied from the original
implementation's reference data) and how to read them: parameters, configs, inputs."""

import jax.numpy as jnp
import numpy as np

from phoenix.grok import TransformerConfig
from phoenix.recsys_model import PhoenixModelConfig, RecsysBatch, RecsysEmbeddings
from phoenix.recsys_retrieval_model import PhoenixRetrievalModelConfig
from tests.conftest import reference_file

TOL = 1e-4


def load_golden() -> dict:
    with np.load(reference_file("golden_public.npz"), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def params(golden, prefix):
    out = {}
    for key, value in golden.items():
        if key.startswith(prefix):
            module, name = key[len(prefix) :].rsplit("/", 1)
            out.setdefault(module, {})[name] = jnp.asarray(value)
    return out


def configs(golden):
    c = lambda k: golden[f"config/{k}"].item()  # noqa: E731
    tc = TransformerConfig(
        emb_size=c("emb_size"),
        key_size=c("key_size"),
        num_q_heads=c("num_q_heads"),
        num_kv_heads=c("num_kv_heads"),
        num_layers=c("num_layers"),
        widening_factor=c("widening_factor"),
        attn_output_multiplier=c("attn_output_multiplier"),
    )
    common = dict(
        model=tc,
        emb_size=c("emb_size"),
        history_seq_len=c("history_seq_len"),
        candidate_seq_len=c("candidate_seq_len"),
        fprop_dtype=jnp.float32,
    )
    ranker = PhoenixModelConfig(
        num_actions=c("num_actions"), right_anchored_rope=bool(c("right_anchored_rope")), **common
    )
    return ranker, PhoenixRetrievalModelConfig(**common)


def inputs(golden):
    batch = RecsysBatch(
        **{f: golden[f"batch/{f}"] for f in RecsysBatch._fields if f"batch/{f}" in golden}
    )
    emb = RecsysEmbeddings(
        **{
            f: golden[f"embeddings/{f}"]
            for f in RecsysEmbeddings.__dataclass_fields__
            if f"embeddings/{f}" in golden
        }
    )
    return batch, emb
