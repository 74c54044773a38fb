"""phoenix.checkpoint.xai_integrity on what the test checkpoint does not show: sharded checksums
(version 2, a device mesh), a B+tree deeper than one node, and the location format."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from phoenix.checkpoint.xai_integrity import (
    Extent,
    XaiCheckpointError,
    array_locations,
    check_files,
    parse_checksums,
    parse_location,
    shard_slices,
    verify_array,
)


class FakeDevice:
    def __init__(self, id: int) -> None:
        self.id = id


@pytest.mark.parametrize(
    "shape, spec, mesh",
    [
        ((8, 3, 4), [("c", "a"), None, "b"], {"a": 2, "b": 2, "c": 2}),
        ((6, 4), ["model"], {"data": 3, "model": 2}),
        ((6, 4), [None, ["data", "model"]], {"data": 2, "model": 2}),
        ((5,), [], {"data": 2}),  # replicated: every device holds it all
    ],
)
def test_shard_slices_are_jaxs_layout(shape, spec, mesh):
    """Device i's block is what jax's NamedSharding gives the device at row-major position i
    of the mesh (how xai_checkpointing orders its shard checksums)."""
    import jax

    devices = np.array([FakeDevice(i) for i in range(int(np.prod(list(mesh.values()))))])
    jax_mesh = jax.sharding.Mesh(devices.reshape(list(mesh.values())), tuple(mesh))
    spec_tuple = tuple(tuple(e) if isinstance(e, list) else e for e in spec)
    sharding = jax.sharding.NamedSharding(jax_mesh, jax.sharding.PartitionSpec(*spec_tuple))
    expected = {d.id: index for d, index in sharding.devices_indices_map(shape).items()}
    values = np.arange(int(np.prod(shape))).reshape(shape)
    blocks = shard_slices(shape, spec, mesh)
    assert len(blocks) == len(expected)
    for device, block in enumerate(blocks):
        np.testing.assert_array_equal(values[block], values[expected[device]])


def version_2(array: np.ndarray, spec: list, mesh: dict) -> dict:
    """A version-2 checksum document for one sharded Parameter (named with its '.0')."""
    blocks = shard_slices(array.shape, spec, mesh)
    sums = [zlib.adler32(np.ascontiguousarray(array[block]).tobytes()) for block in blocks]
    name = "params.~.table.0"
    return {
        "version": 2,
        "shapes": {name: list(array.shape)},
        "dtypes": {name: array.dtype.str},
        "shardings": {name: {"spec": spec, "mesh": mesh}},
        "shard_checksums": {name: sums},
    }


def test_version_2_shard_checksums(tmp_path):
    array = np.arange(48, dtype=np.float32).reshape(6, 8)
    mesh = {"data": 2, "model": 2}
    document = version_2(array, [None, "model"], mesh)
    checksums = parse_checksums(tmp_path / "checksums.0.json", document)
    verify_array(checksums, "params.~.table", array, "d/x")  # '.0' dropped, as xrex reads v2
    damaged = array.copy()
    damaged[0, 7] += 1  # the second half of the columns: devices 1 and 3
    with pytest.raises(XaiCheckpointError, match=r"'params.~.table' \(device 1\)"):
        verify_array(checksums, "params.~.table", damaged, "d/x")


def test_a_checksum_list_of_the_wrong_length(tmp_path):
    array = np.zeros((4, 4), np.float32)
    document = version_2(array, ["data"], {"data": 2})
    document["shard_checksums"]["params.~.table.0"].pop()
    checksums = parse_checksums(tmp_path / "checksums.0.json", document)
    with pytest.raises(XaiCheckpointError, match="2 device shards, but the file records"):
        verify_array(checksums, "params.~.table", array, "d/x")


def test_locations():
    assert parse_location("value:ocdbt.process_0/:d/fa38:10:4116") == (
        "value",
        Extent("ocdbt.process_0/d/fa38", 10, 4116),
    )
    assert parse_location("btreenode::d/c33b:0:5773") == ("btreenode", Extent("d/c33b", 0, 5773))


def test_a_deep_b_tree_is_walked_with_its_key_prefixes(tmp_path):
    """Tiny nodes force a tree of several levels, whose child keys drop their parents'
    common prefix; every array's chunks are still found, and a cut data file is named."""
    import tensorstore as ts

    spec = {
        "driver": "ocdbt",
        "config": {"max_inline_value_bytes": 8, "max_decoded_node_bytes": 200},
        "base": f"file://{tmp_path}/",
    }
    store = ts.KvStore.open(spec).result()
    names = [f"params.transformer/layer_{i:02d}.w" for i in range(40)]
    with ts.Transaction() as txn:
        for i, name in enumerate(names):
            store.with_transaction(txn)[f"{name}/zarr.json"] = b"{}"
            store.with_transaction(txn)[f"{name}/c/0/0"] = bytes(20 + i)
    base = ts.KvStore.open(f"file://{tmp_path}/").result()
    root = ts.ocdbt.dump(base).result()["versions"][-1]["root_height"]
    assert root >= 2
    found = array_locations(tmp_path)
    assert sorted(found) == names
    for i, name in enumerate(names):
        assert found[name].has_metadata and [e.length for e in found[name].extents] == [20 + i]
    check_files(tmp_path, found, names)
    (data,) = (tmp_path / "d").glob("*")
    data.write_bytes(data.read_bytes()[:30])
    with pytest.raises(XaiCheckpointError, match=f"^{data}: truncated: 30 bytes, but array"):
        check_files(tmp_path, found, names)
