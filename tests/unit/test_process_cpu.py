"""harness.process_cpu: CPU per request from two readings of a served stack."""

import subprocess
import sys
import time
from collections import Counter

from harness.process_cpu import cpu_ms_per_request, cpu_seconds


def test_a_busy_process_has_spent_cpu_and_a_gone_one_reads_zero():
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", burn + "\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while cpu_seconds(child.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_seconds(child.pid) >= 0.3  # its busy loop, then it waits on stdin
    finally:
        child.communicate(b"")
    assert cpu_seconds(child.pid) == 0.0  # reaped: gone


def test_cpu_per_request_is_the_difference_over_the_requests_with_a_total():
    before = Counter({"tritonserver": 1.0, "ranker": 2.0, "redis": 0.5})
    after = Counter({"tritonserver": 1.5, "ranker": 4.0, "redis": 0.5})
    assert cpu_ms_per_request(before, after, 100) == {
        "tritonserver": 5.0,
        "ranker": 20.0,
        "redis": 0.0,
        "total": 25.0,
    }
