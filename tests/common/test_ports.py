"""``common.ports.free_port``: a bindable port outside the range the OS hands out to other sockets."""

import socket
from pathlib import Path

import pytest

from common import ports


def test_the_port_is_free_and_below_every_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    drawn = {ports.free_port() for _ in range(20)}
    assert all(port in ports.PORTS and port < min(low, 49152) for port in drawn)
    assert len(drawn) > 1  # drawn at random: two processes starting servers together draw apart
    for port in drawn:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_a_range_that_is_all_taken_is_said_as_such(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        taken.listen()
        monkeypatch.setattr(ports, "PORTS", range(port, port + 1))
        with pytest.raises(OSError, match=f"no free port on 127.0.0.1 in 64 draws from {port}-{port}"):
            ports.free_port()
