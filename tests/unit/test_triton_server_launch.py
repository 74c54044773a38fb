"""TritonServer's launch: a start that fails after writing its temporary folders removes them;
each server's shared memory is named so that what it leaves can be removed."""

from __future__ import annotations

import pytest

from phoenix.ops.configs import REPOSITORY
from phoenix.ops.triton_server import SHARED_MEMORY, SHARED_MEMORY_PREFIX, TritonServer


def test_a_launch_that_fails_leaves_no_temporary_folders(tmp_path, tiny_artifacts):
    # An environment value with a NUL byte: Popen itself refuses it, after the served
    # repository (artifacts_dir) and the stub folder were made beside the log.
    server = TritonServer(
        REPOSITORY,
        artifacts_dir=tiny_artifacts,
        log_path=tmp_path / "server.log",
        env={"PHOENIX_TEST_BAD": "nul\0byte"},
    )
    with pytest.raises(ValueError, match="null byte"):
        server.start()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["server.log"]
    assert not server.is_running()


def test_each_server_names_its_shared_memory_with_a_prefix_of_its_own(tmp_path):
    """So that stop() and kill() find what a server left in /dev/shm, and only that."""
    first, second = (TritonServer(tmp_path) for _ in range(2))
    prefixes = {first.shared_memory_prefix, second.shared_memory_prefix}
    assert len(prefixes) == 2 and all(p.startswith(SHARED_MEMORY_PREFIX) for p in prefixes)
    flag = f"--backend-config=python,shm-region-prefix-name={first.shared_memory_prefix}"
    assert flag in first.command()
    (SHARED_MEMORY / f"{second.shared_memory_prefix}0000").write_bytes(b"")  # not first's
    try:
        assert first.shared_memory_regions() == []
        assert second.shared_memory_regions() == [
            SHARED_MEMORY / f"{second.shared_memory_prefix}0000"
        ]
    finally:
        (SHARED_MEMORY / f"{second.shared_memory_prefix}0000").unlink()
