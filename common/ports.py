"""A TCP port for a server this process is about to start: a Ray dashboard, a torch rendezvous, a local S3."""
import random
import socket

# Below the ephemeral ranges (Linux 32768-60999, macOS/Windows 49152-65535), from which every outgoing connection
# and every bind to port 0 draws: a port probed there can be taken between the probe and the server's own bind (a
# Ray dashboard once failed so). Above Ray's worker ports (10002-19999).
PORTS = range(20000, 32768)
TRIES = 64


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``PORTS`` that ``host`` can bind now, drawn at random (the OS's entropy, not the seeded ``random``
    of a trial, so that two processes draw apart); OSError if ``TRIES`` draws are all taken."""
    draw = random.SystemRandom()
    for _ in range(TRIES):
        port = draw.choice(PORTS)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is free
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port on {host} in {TRIES} draws from {PORTS.start}-{PORTS.stop - 1}")
