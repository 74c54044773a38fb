"""phoenix.artifacts: deterministic, loadable, non-degenerate demo artifacts."""

from pathlib import Path

import haiku as hk
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix import runners
from phoenix.artifact_parts import FEATURE_TABLES
from phoenix.artifacts import generate, main
from phoenix.checkpoint import (
    flatten_params,
    load_artifacts,
    load_corpus,
    load_example_sequence,
)
from phoenix.hashing import hash_ids
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from tests.plain_models import jitted_apply

CORPUS_SIZE = 64
FILES = (
    "config.json",
    "ranker/model_params.npz",
    "retrieval/model_params.npz",
    "embedding_tables.npz",
    "corpus.npz",
    "example_sequence.json",
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-seed0")
    generate("tiny", out, seed=0, corpus_size=CORPUS_SIZE)
    return out


@pytest.fixture(scope="module")
def loaded(tiny):
    return load_artifacts(tiny)


def test_same_seed_gives_identical_files(tiny, tmp_path):
    summary = generate("tiny", tmp_path, seed=0, corpus_size=CORPUS_SIZE)
    assert summary.corpus_size == CORPUS_SIZE
    assert sorted(summary.file_sizes) == sorted(FILES)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (tiny / name).read_bytes(), name


def test_other_seed_gives_other_weights(loaded, tmp_path):
    generate("tiny", tmp_path, seed=1, corpus_size=CORPUS_SIZE)
    other = load_artifacts(tmp_path)
    assert other.config.hash_params != loaded.config.hash_params
    ours, theirs = flatten_params(loaded.ranker_params), flatten_params(other.ranker_params)
    assert ours.keys() == theirs.keys()
    for key in ours:
        if ours[key].ndim:  # every array but the scalar temperature
            assert not np.array_equal(ours[key], theirs[key]), key
    assert not np.array_equal(other.tables["user_embeddings"], loaded.tables["user_embeddings"])
    assert not np.array_equal(load_corpus(tmp_path).post_ids, load_corpus(loaded.root).post_ids)


def test_weights_are_not_degenerate(loaded):
    for name, params in (("ranker", loaded.ranker_params), ("retrieval", loaded.retrieval_params)):
        for key, value in flatten_params(params).items():
            if key.endswith("/scale"):  # RMSNorm scales: around 1, not all equal
                assert abs(value.mean() - 1) < 0.05 and value.std() > 0.01, (name, key)
            elif value.ndim == 2 and key.rpartition("/")[2] not in FEATURE_TABLES:
                fan_in = value.shape[0]
                assert value.std() == pytest.approx(fan_in**-0.5, rel=0.3), (name, key)
    for table in loaded.tables.values():
        assert 0.05 < table.std() < 1.0


def test_config_and_example(tiny, loaded):
    config = loaded.config
    assert (config.emb_size, config.num_layers, config.num_heads, config.key_size) == (32, 2, 2, 16)
    assert (config.history_seq_len, config.candidate_seq_len, config.num_actions) == (12, 6, 19)
    original = tuple(name.removesuffix("_score") for name in runners.ACTIONS)
    assert config.action_names == original  # the original runners' ACTIONS
    assert config.action_names[0] == "favorite" and config.action_names[18] == "dwell_time"
    for entity in ("user", "item", "author"):
        params = config.hash_params.for_entity(entity)
        assert all(v % 2 == 1 and 0 < v < params.modulus for v in params.scales + params.biases)

    corpus = load_corpus(tiny, config)
    example = load_example_sequence(tiny, config)
    authors = dict(zip(corpus.post_ids.tolist(), corpus.author_ids.tolist(), strict=True))
    history, candidates = example.history_post_ids, example.candidate_post_ids
    assert 1 <= len(history) <= config.history_seq_len
    assert 1 <= len(candidates) <= config.candidate_seq_len
    assert not set(history) & set(candidates)
    assert [authors[p] for p in history] == list(example.history_author_ids)
    assert [authors[p] for p in candidates] == list(example.candidate_author_ids)
    assert all(any(row) for row in example.history_actions)
    assert 1 <= example.top_k <= len(corpus)


def fresh_candidate_vectors(loaded, post_ids, author_ids) -> np.ndarray:
    """The candidate tower applied directly to rows of the per-entity tables."""
    config = loaded.config
    post_hashes = hash_ids(post_ids, config.hash_params.item, config.item_vocab_size)
    author_hashes = hash_ids(author_ids, config.hash_params.author, config.author_vocab_size)
    n, D = len(post_ids), config.emb_size
    unused = np.zeros((1, 1), np.int32)
    batch = RecsysBatch(
        unused, unused[..., None], unused[..., None], unused[..., None], unused,
        post_hashes[None], author_hashes[None], np.zeros((1, n), np.int32),
    )  # fmt: skip
    empty = np.zeros((1, 1, 1, D), np.float32)
    embeddings = RecsysEmbeddings(
        user_embeddings=empty[:, 0],
        history_post_embeddings=empty,
        candidate_post_embeddings=loaded.tables["item_embeddings"][post_hashes][None],
        history_author_embeddings=empty,
        candidate_author_embeddings=loaded.tables["author_embeddings"][author_hashes][None],
    )
    model_config = config.retrieval_config(jnp.float32)
    tower = hk.transform(lambda b, e: model_config.make().build_candidate_representation(b, e))
    vectors, mask = tower.apply(loaded.retrieval_params, None, batch, embeddings)
    assert np.asarray(mask).all()
    return np.asarray(vectors)[0]


def test_corpus_is_the_candidate_tower_output(tiny, loaded):
    corpus = load_corpus(tiny, loaded.config)
    assert len(corpus) == CORPUS_SIZE
    np.testing.assert_allclose(np.linalg.norm(corpus.embeddings, axis=1), 1.0, atol=1e-5)
    assert len(np.unique(corpus.author_ids)) < CORPUS_SIZE  # authors come from a smaller pool
    picks = np.array([0, 7, CORPUS_SIZE - 1])
    expected = fresh_candidate_vectors(loaded, corpus.post_ids[picks], corpus.author_ids[picks])
    np.testing.assert_allclose(corpus.embeddings[picks], expected, atol=1e-5)
    # different posts get different vectors
    similarity = corpus.embeddings @ corpus.embeddings.T
    assert similarity[~np.eye(CORPUS_SIZE, dtype=bool)].max() < 0.99


def test_ranker_scores_differ_across_candidates_and_users(tiny, loaded):
    config, embedder = loaded.config, loaded.embedder()
    example = load_example_sequence(tiny, config)
    S, C = config.history_seq_len, config.candidate_seq_len

    def padded(values, length):
        values = np.asarray(values)
        return np.concatenate(
            [values, np.zeros((length - len(values),) + values.shape[1:], values.dtype)]
        )[None]

    def logits(user_id):
        user_hashes, user_rows = embedder.hash_users(np.array([user_id]))
        hp, hp_rows = embedder.hash_items(padded(example.history_post_ids, S))
        ha, ha_rows = embedder.hash_authors(padded(example.history_author_ids, S))
        cp, cp_rows = embedder.hash_items(padded(example.candidate_post_ids, C))
        ca, ca_rows = embedder.hash_authors(padded(example.candidate_author_ids, C))
        batch = RecsysBatch(
            user_hashes, hp, ha,
            padded(np.array(example.history_actions), S),
            padded(example.history_product_surface, S),
            cp, ca, padded(example.candidate_product_surface, C),
        )  # fmt: skip
        gather = embedder.lookup
        embeddings = RecsysEmbeddings(
            gather(user_rows), gather(hp_rows), gather(cp_rows), gather(ha_rows), gather(ca_rows)
        )
        output = rank(loaded.ranker_params, batch, embeddings)
        return np.asarray(output.logits)[0, : len(example.candidate_post_ids)]

    rank = jitted_apply("ranker", config.ranker_config(jnp.float32), lambda m, b, e: m(b, e))

    first, second = logits(example.user_id), logits(example.user_id + 1)
    assert np.all(np.isfinite(first))
    assert first.std(axis=0).mean() > 0.05  # candidates are told apart
    assert np.abs(first - second).mean() > 1e-3  # and so are users


def test_cli_refuses_a_non_empty_directory(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["--preset", "tiny", "--out", str(tmp_path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_cli_writes_and_summarises(tmp_path, capsys):
    out = tmp_path / "new"
    assert main(["--preset", "tiny", "--out", str(out), "--corpus-size", "16", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "corpus 16" in printed and "embedding_tables.npz" in printed
    assert len(load_corpus(out)) == 16
    assert main(["--preset", "tiny", "--out", str(out), "--corpus-size", "16", "--force"]) == 0


def test_unknown_preset_and_tiny_corpus_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        generate("huge", tmp_path)
    with pytest.raises(ValueError, match="corpus_size"):
        generate("tiny", tmp_path, corpus_size=1)
