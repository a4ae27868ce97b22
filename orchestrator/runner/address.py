"""What an `--address` names, checked before `ray.init` takes it.

ARCHITECTURE.md "The path of one evaluation", step 1 (`--address` for a cluster). Ray retries an address where
nothing answers for minutes and waits as long on a web server's port; these checks answer at once, in one line
naming the address. They also tell whether an address names another Ray than the one this process is connected to,
and keep the cause Ray chains to a connection error (a cluster with token authentication names `RAY_AUTH_MODE`
only there).
"""

from __future__ import annotations

import socket

from orchestrator.errors import UsageError


def _host_port(address: str) -> tuple[set[str], int] | None:
    """The IP addresses and port of a "host:port" address ("[::1]:6379" too), or None when it is not one."""
    text = address.strip().rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    try:
        ips = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return None
    return ips, int(port)


def _other_ray(address: str, current: str) -> bool:
    """Whether `address` certainly names another Ray than the one at `current` (its GCS "ip:port"): a "ray://"
    address (a client connection, where this process is a driver of `current`), or a "host:port" whose host
    resolves to none of `current`'s addresses or whose port differs ("localhost:6379" is "127.0.0.1:6379").
    "auto", "local" and what cannot be resolved are not refused."""
    if address in ("auto", "local"):
        return False
    if address.startswith("ray://"):
        return True
    asked, here = _host_port(address), _host_port(current)
    if asked is None or here is None:
        return False
    return asked[1] != here[1] or not (asked[0] & here[0])



def _connection_error_line(exc: BaseException) -> str:
    """The first line of Ray's connection error, with the first line of each cause it chains that says more
    (a cluster with token authentication fails as "Failed to connect to Ray cluster at ...", and only the
    cause, an AuthenticationError, names RAY_AUTH_MODE)."""
    lines = [(str(exc).strip().splitlines() or [type(exc).__name__])[0]]
    cause, seen = exc.__cause__ or exc.__context__, {id(exc)}
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        first = (str(cause).strip().splitlines() or [""])[0]
        if first and all(first not in line for line in lines):
            lines.append(f"{type(cause).__name__}: {first}")
        cause = cause.__cause__ or cause.__context__
    return "; ".join(lines)[:600]


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) address where nothing accepts a connection.

    Ray itself retries such an address for minutes (its GCS client) before it fails with a timeout; one TCP
    connect tells the user at once. "auto" is checked at the address Ray resolves it to (`_auto_ray_address`): a
    driver killed before it shut its local Ray down leaves its record behind, and a Ray in another network
    namespace shows its GCS process; "auto" would then hang for minutes. "local" is Ray's; a malformed address is
    left to Ray's parser, whose error the caller reports.
    """
    if address == "auto":
        found = _auto_ray_address()
        if found:
            try:
                _check_reachable(found, timeout_s)
            except UsageError:
                raise UsageError(
                    f"`--address` 'auto': the Ray it finds ({found}: RAY_ADDRESS, the address the last Ray on this "
                    "machine recorded, or a running GCS process) does not answer; is that Ray gone (a run killed "
                    "before it shut its Ray down leaves its record), or in another network namespace? Start one "
                    "with `ray start --head`, or leave --address out for a local Ray") from None
        return
    if address == "local":
        return
    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    host = host.strip("[]")
    if not 0 < int(port) < 65536:
        raise UsageError(f"`--address` {address!r}: port {port} is not in 1-65535")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
            speaks_http1 = _answers_http1(conn, timeout_s)
    except OSError as exc:  # refused, unreachable, unknown host, timeout
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise UsageError(
            f"`--address` {address!r}: nothing answers at {host}:{port} ({reason}); is the cluster's head "
            "running (`ray start --head`), and is this its address?"
        ) from None
    if speaks_http1:
        raise UsageError(
            f"`--address` {address!r}: {host}:{port} answers as a web server (HTTP/1) does, such as Ray's dashboard ("
            "the address `ray job submit` takes), not Ray's GCS; give the address `ray start --head` printed "
            "(port 6379 by default), or 'auto' on a node of the cluster")


#: the HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4): what a gRPC client sends first
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _answers_http1(conn: socket.socket, timeout_s: float) -> bool:
    """Whether the server on `conn` answers a gRPC client's first bytes in text, as an HTTP/1 server does ("HTTP/1.1
    400 ...", or an HTML error page). Ray's GCS and client server speak gRPC (HTTP/2) and answer with a binary
    SETTINGS frame (a TLS server with a binary alert). The dashboard's port (8265, which the README's
    `ray job submit` uses) passes the connect check, and `ray.init` then waits 14 minutes. No answer,
    or a reset, counts as not HTTP/1: Ray decides."""
    try:
        conn.settimeout(min(timeout_s, 2.0))
        conn.sendall(_HTTP2_PREFACE)
        head = conn.recv(16)[:4]
    except OSError:
        return False
    return bool(head) and all(32 <= b < 127 or b in (9, 10, 13) for b in head)


def _auto_ray_address() -> str | None:
    """The address `ray.init("auto")` would connect to (RAY_ADDRESS, the one the last Ray on this machine
    recorded, or a running GCS process's), or None when there is none (Ray then says so itself)."""
    try:
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
    except Exception:  # noqa: BLE001 - none found (Ray's ConnectionError), or a private Ray API that moved
        return None
    return found if isinstance(found, str) and found not in ("auto", "local", "") else None
