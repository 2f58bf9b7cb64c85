"""Listening on a TCP port, for the commands that serve over HTTP (`tunesmith serve`, `tunesmith ui`): which hosts
are this machine alone, and a socket bound before anything slow starts, so that a busy port fails at once."""

from __future__ import annotations

import socket

from ..errors import ConfigError

# The --host values only this machine reaches; any other needs a key (serve) or a password (ui).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, as uvicorn would bind it; a busy port or unknown host is a config error."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}); choose another "
                          "--port, or stop what uses it") from None
    sock.set_inheritable(True)
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host` (the system's choice): --port 0, or a rendezvous port for a world of one process."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
