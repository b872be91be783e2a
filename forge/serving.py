"""The web apps' server (forge ui, forge lab): uvicorn on sockets bound here first, so that a port in use or an
address this machine does not have is one line of bad input (UserError) before anything is printed or built,
and the address printed is one that is being served."""

from __future__ import annotations

import errno
import socket
from typing import Any

from forge.errors import UserError


def require_ui(command: str) -> None:
    """UserError unless the ui extra (FastAPI, uvicorn) is installed: `forge COMMAND` needs it."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UserError(f"forge {command} needs the ui extra: pip install 'forge-kernels[ui]' ({e})") from e


def bound(host: str, port: int) -> list[socket.socket]:
    """TCP sockets bound to every address `host` names, at `port` (not yet listening), as asyncio's server binds
    them (an IPv6 socket for IPv6 only; an address family this machine lacks is left out); UserError when none
    can be bound, or one is in use."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"cannot serve on {host}:{port}: {e.strerror} (--host names another address)") from None
    socks: list[socket.socket] = []
    why = "no address"
    for family, kind, proto, _, address in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio does: a port in TIME_WAIT is free
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
        except OSError as e:
            sock.close()
            why = e.strerror or str(e)
            if e.errno == errno.EADDRNOTAVAIL:  # this family is not enabled here
                continue
            for s in socks:
                s.close()
            raise UserError(f"cannot serve on {host}:{port}: {why} (--port picks another port)") from None
        socks.append(sock)
    if not socks:
        raise UserError(f"cannot serve on {host}:{port}: {why} (--host names another address)")
    return socks


def url(host: str, port: int) -> str:
    """The address to open in a browser (an IPv6 address in brackets)."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(app: Any, socks: list[socket.socket], banner: str) -> None:
    """Serve the ASGI `app` on sockets from `bound` until Ctrl-C (which ends it as a normal stop); `banner` is
    printed first."""
    import uvicorn

    print(banner)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=socks)
    except KeyboardInterrupt:  # uvicorn stops the server, then raises the signal again
        pass
