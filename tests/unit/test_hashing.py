"""phoenix.hashing: vectorised hashes equal a pure-Python reference; stacked-table rows."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phoenix.artifacts import PRESETS, preset_config
from phoenix.config_parts import EntityHashParams
from phoenix.hashing import (
    NUM_RESERVED_ROWS,
    HashEmbedder,
    hash_ids,
    stack_tables,
    stacked_num_rows,
    table_offsets,
    table_rows,
)

INT64_MAX = 2**63 - 1
PARAMS = EntityHashParams(
    scales=(0x5BD1E995 * 2 + 1, 2**61 - 3, 3),
    biases=(12345, 2**60 + 7, 2**61 - 2),
    modulus=2**61 - 1,
)
VOCAB = 1_000


def wrap(x: int) -> int:
    """Python int -> the int64 value with the same low 64 bits."""
    return ((x + 2**63) % 2**64) - 2**63


def reference_hash(id_: int, scale: int, bias: int, modulus: int, vocab: int) -> int:
    if id_ == 0:
        return 0
    mixed = wrap(wrap(id_ * scale) + bias)
    return (mixed % modulus) % (vocab - 1) + 1


def reference_hashes(ids, params=PARAMS, vocab=VOCAB) -> np.ndarray:
    rows = [
        [
            reference_hash(int(i), s, b, params.modulus, vocab)
            for s, b in zip(params.scales, params.biases, strict=True)
        ]
        for i in np.ravel(ids)
    ]
    return np.array(rows, dtype=np.int64).reshape(*np.shape(ids), len(params.scales))


EXTREME_IDS = [
    0,
    1,
    2,
    -1,
    2**31,
    2**32 + 1,
    2**62,
    2**62 + 12345,
    INT64_MAX,
    INT64_MAX - 1,
    -(2**63),
    -(2**62),
    3 * 2**60,  # id * scale overflows for every scale above 2
]


@pytest.fixture(scope="module")
def config():
    return preset_config(PRESETS["tiny"], seed=0)


def test_random_ids_match_reference():
    ids = np.random.default_rng(0).integers(-(2**63), INT64_MAX, size=(7, 11), dtype=np.int64)
    hashes = hash_ids(ids, PARAMS, VOCAB)
    assert hashes.shape == (7, 11, 3) and hashes.dtype == np.int64
    np.testing.assert_array_equal(hashes, reference_hashes(ids))


def test_extreme_ids_match_reference():
    ids = np.array(EXTREME_IDS, dtype=np.int64)
    with np.errstate(all="raise"):  # the implementation must silence its own wrap-around
        hashes = hash_ids(ids, PARAMS, VOCAB)
    np.testing.assert_array_equal(hashes, reference_hashes(ids))


@settings(max_examples=300, deadline=None)
@given(
    id_=st.integers(min_value=-(2**63), max_value=INT64_MAX),
    scale=st.integers(min_value=1, max_value=INT64_MAX),
    bias=st.integers(min_value=0, max_value=INT64_MAX),
    modulus=st.integers(min_value=1, max_value=INT64_MAX),
    vocab=st.integers(min_value=2, max_value=10**7),
)
def test_any_int64_matches_reference(id_, scale, bias, modulus, vocab):
    params = EntityHashParams(scales=(scale,), biases=(bias,), modulus=modulus)
    got = hash_ids(np.array([id_], dtype=np.int64), params, vocab)
    assert got.tolist() == [[reference_hash(id_, scale, bias, modulus, vocab)]]


def test_hashes_lie_in_vocab_and_zero_is_padding():
    random_ids = np.random.default_rng(1).integers(1, 2**62, 20_000, dtype=np.int64)
    ids = np.concatenate([random_ids, np.array(EXTREME_IDS[1:], np.int64)])
    hashes = hash_ids(ids, PARAMS, VOCAB)
    assert hashes.min() >= 1 and hashes.max() <= VOCAB - 1
    assert hash_ids(np.zeros(4, np.int64), PARAMS, VOCAB).tolist() == [[0, 0, 0]] * 4
    # random ids reach (nearly) every non-padding row
    assert len(np.unique(hashes[:, 0])) > 0.99 * (VOCAB - 1)


def test_scalar_and_uint_inputs():
    assert hash_ids(5, PARAMS, VOCAB).shape == (3,)
    np.testing.assert_array_equal(
        hash_ids(np.array([2**64 - 1], np.uint64), PARAMS, VOCAB),
        hash_ids(np.array([-1], np.int64), PARAMS, VOCAB),
    )
    with pytest.raises(ValueError, match="integers"):
        hash_ids(np.array([1.5]), PARAMS, VOCAB)
    with pytest.raises(ValueError, match="vocab_size"):
        hash_ids(np.array([1]), PARAMS, 1)


def test_table_offsets_and_rows(config):
    users, items = config.user_vocab_size, config.item_vocab_size
    assert table_offsets(config) == {
        "user": NUM_RESERVED_ROWS,
        "item": NUM_RESERVED_ROWS + users,
        "author": NUM_RESERVED_ROWS + users + items,
    }
    hashes = np.array([[0, 1], [5, config.item_vocab_size - 1]])
    np.testing.assert_array_equal(
        table_rows("item", hashes, config),
        [
            [0, NUM_RESERVED_ROWS + users + 1],
            [NUM_RESERVED_ROWS + users + 5, NUM_RESERVED_ROWS + users + items - 1],
        ],
    )


def _tables(config, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((config.vocab_size(e), config.emb_size)).astype(np.float32)
        for e in ("user", "item", "author")
    ]


def test_stack_tables_layout(config):
    user, item, author = _tables(config)
    table = stack_tables(user, item, author)
    assert table.dtype == np.float32
    assert table.shape == (stacked_num_rows(config), config.emb_size)
    assert not table[:NUM_RESERVED_ROWS].any()
    offsets = table_offsets(config)
    np.testing.assert_array_equal(table[offsets["user"] : offsets["item"]], user)
    np.testing.assert_array_equal(table[offsets["item"] : offsets["author"]], item)
    np.testing.assert_array_equal(table[offsets["author"] :], author)
    with pytest.raises(ValueError, match="one D"):
        stack_tables(user, item, author[:, :-1])


def test_embedder_gathers_the_entity_rows(config):
    user, item, author = _tables(config)
    embedder = HashEmbedder(config, stack_tables(user, item, author))
    ids = np.array([[0, 17, 2**62 + 3]], dtype=np.int64)
    for entity, table, method in (
        ("user", user, embedder.hash_users),
        ("item", item, embedder.hash_items),
        ("author", author, embedder.hash_authors),
    ):
        hashes, rows = method(ids)
        params = config.hash_params.for_entity(entity)
        expected = reference_hashes(ids, params, config.vocab_size(entity))
        np.testing.assert_array_equal(hashes, expected)
        gathered = embedder.lookup(rows)  # [1, 3, nH, D]
        assert not gathered[0, 0].any()  # padding reads a zero row
        np.testing.assert_array_equal(gathered[0, 1:], table[hashes[0, 1:]])


def test_embedder_rejects_a_table_of_the_wrong_shape(config):
    with pytest.raises(ValueError, match="expected"):
        HashEmbedder(config, np.zeros((10, config.emb_size), np.float32))
