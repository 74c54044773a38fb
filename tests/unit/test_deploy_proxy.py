"""The nginx configuration of `make bench-replicas` is one the real nginx accepts (`nginx -t`),
with and without retries, and with a replica marked down."""

from __future__ import annotations

import subprocess

import pytest

from bench.bench_replicas import Proxy, nginx_binary
from bench.serving_servers import ServePorts


class Stub:
    def __init__(self, name, ports):
        self.name, self.ports = name, ports


@pytest.mark.parametrize("retries", [True, False])
def test_nginx_accepts_the_benchmarks_configuration(tmp_path, retries):
    replicas = [Stub("a", ServePorts(1001, 1002, 1003, 1004)),
                Stub("b", ServePorts(2001, 2002, 2003, 2004))]  # fmt: skip
    proxy = Proxy(tmp_path, replicas)
    proxy.retries = retries
    proxy.write({"b"})
    conf = proxy.work / "nginx.conf"
    assert "server 127.0.0.1:1001 down;" in conf.read_text()
    result = subprocess.run(
        [nginx_binary(), "-t", "-p", str(proxy.work), "-c", str(conf), "-e",
         str(proxy.work / "error.log")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
