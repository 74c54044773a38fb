"""phoenix.util.processes.pick_free_ports: the kernel's ports, or a range of its own per process."""

import contextlib
import socket

import pytest

from phoenix.util.processes import LOOPBACK, PORT_RANGE_ENV, pick_free_ports


def free_block(size: int) -> int:
    """The first port of ``size`` consecutive free ports below the test workers' ranges."""
    for low in range(15_000, 20_000 - size, size):
        with contextlib.ExitStack() as held:
            try:
                for port in range(low, low + size):
                    held.enter_context(socket.socket()).bind((LOOPBACK, port))
            except OSError:
                continue
            return low
    raise AssertionError("no free block of ports")


def test_ports_come_from_the_range_when_one_is_set_and_skip_ports_in_use(monkeypatch):
    low = free_block(3)
    with socket.socket() as taken:
        taken.bind((LOOPBACK, low + 1))  # a 3-port range, its middle port in use
        monkeypatch.setenv(PORT_RANGE_ENV, f"{low}-{low + 2}")
        ports = pick_free_ports(2)
    assert sorted(ports) == [low, low + 2]


def test_a_range_without_enough_free_ports_is_an_error_naming_it(monkeypatch):
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        busy = taken.getsockname()[1]
        monkeypatch.setenv(PORT_RANGE_ENV, f"{busy}-{busy}")
        with pytest.raises(OSError, match=PORT_RANGE_ENV):
            pick_free_ports(1)


def test_without_a_range_the_kernel_picks_distinct_ports(monkeypatch):
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    ports = pick_free_ports(3)
    assert len(set(ports)) == 3
