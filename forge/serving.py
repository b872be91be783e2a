"""The web apps' server (forge ui, forge lab): uvicorn on a socket bound here first, so that a port in use or
an address this machine does not have is one line of bad input (UserError) before anything is printed, and the
address printed is one that is being served."""

from __future__ import annotations

import socket
from typing import Any

from forge.errors import UserError


def bound(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening); UserError when it cannot be."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"cannot serve on {host}:{port}: {e.strerror} (--host names another address)") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a port in TIME_WAIT is free
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot serve on {host}:{port}: {e.strerror} (--port picks another port)") from None
    return sock


def serve(app: Any, host: str, port: int, banner: str) -> None:
    """Serve the ASGI `app` on host:port until Ctrl-C; `banner` is printed once the port is held."""
    import uvicorn

    sock = bound(host, port)
    print(banner)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
