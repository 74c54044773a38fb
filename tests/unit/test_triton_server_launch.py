"""TritonServer.start() that fails after writing its temporary folders removes them."""

from __future__ import annotations

import pytest

from phoenix.ops.configs import REPOSITORY
from phoenix.ops.triton_server import TritonServer


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
