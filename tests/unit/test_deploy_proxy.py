"""The nginx configuration of `make bench-replicas` (harness/proxy.py) is one the real
nginx accepts (`nginx -t`), with and without retries, and with a replica marked down."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest

from harness.proxy import Proxy
from harness.serve_process import ServePorts


@dataclass
class Upstream:
    name: str
    ports: ServePorts


@pytest.mark.parametrize("retries", [True, False])
def test_nginx_accepts_the_benchmarks_configuration(tmp_path, retries):
    replicas = [Upstream("a", ServePorts(1001, 1002, 1003, 1004)),
                Upstream("b", ServePorts(2001, 2002, 2003, 2004))]  # fmt: skip
    proxy = Proxy(tmp_path, replicas)
    proxy.retries = retries
    proxy.write({"b"})
    text = proxy.conf.read_text()
    assert "server 127.0.0.1:1001 down;" in text and "server 127.0.0.1:2001;" in text
    assert ("proxy_next_upstream_tries 2;" in text) == retries
    result = subprocess.run(proxy.command("-t"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
