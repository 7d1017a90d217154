"""`--ray HOST:PORT` (or ray://HOST:PORT) checked by one TCP connection before Ray is asked:
`ray.init` toward an address where nothing answers retries for minutes, prints Ray's
multi-line warnings and does not end on SIGTERM (issue 36's sweep). `auto` is left to Ray,
which answers at once when this machine runs no cluster."""

from __future__ import annotations

import socket

from traces.errors import ConfigError, show

CONNECT_TIMEOUT_S = 5.0
"""A cluster's head answers a connection in milliseconds; five seconds allow a slow WAN."""


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of 'HOST:PORT', 'ray://HOST:PORT' or '[IPv6]:PORT'."""
    bare = address.removeprefix("ray://")
    host, colon, port = bare.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray: {show(address)} is not HOST:PORT, ray://HOST:PORT or auto")
    return host, int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse an address where no cluster answers a TCP connection within `timeout_s`."""
    if address == "auto":
        return
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except TimeoutError:
        raise ConfigError(f"--ray: no Ray cluster answers at {address} (no reply within "
                          f"{timeout_s:g} s)") from None
    except OSError as err:  # refused, unknown host, no route
        reason = err.strerror or str(err) or type(err).__name__
        raise ConfigError(f"--ray: no Ray cluster answers at {address}: {reason}") from None
