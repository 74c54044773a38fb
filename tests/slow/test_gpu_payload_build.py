"""`make gpu-payload` end to end (harness/gpu_payload.py): the whole payload built
and measured.

In the slow tier because it xz-compresses the server (over 100 MiB, about 20 s) and
downloads wheels with pip; the builder's parts are unit-tested in tests/unit/test_gpu_payload.py.
"""

import json
from pathlib import Path

from harness import gpu_payload as payload

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_built_payload_is_under_the_limit_with_every_member(tmp_path):
    """`make gpu-payload` end to end (the server archive is xz-compressed)."""
    built = tmp_path / "gpu"
    limit = payload.payload_limit_mib(64)  # with the tracked files, within 64 MiB
    size = payload.build(built, payload.TARGET_PYTHON, REPO_ROOT / "build" / "wheels", limit)
    assert size <= limit * 2**20
    members = json.loads((built / payload.MANIFEST).read_text())["members"]
    assert payload.SERVER_ARCHIVE in members
    wheels = {Path(m).name.split("-")[0] for m in members if m.startswith("wheels/")}
    assert {"dm_haiku", "jmp", "redis", "hiredis", "tritonclient", "gevent"} <= wheels
    assert any(m.startswith("perf_analyzer/tritonclient-2.51.0-") for m in members)
