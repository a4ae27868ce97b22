"""What an `--address` names, checked before `ray.init` takes it.

ARCHITECTURE.md "The path of one evaluation", step 1 (`--address` for a cluster). Ray retries an address where
nothing answers for minutes and waits as long on a web server's port; these checks answer at once, in one line
naming the address. They also tell whether an address names another Ray than the one this process is connected
to, and keep the cause Ray chains to a connection error.

Token authentication (`RAY_AUTH_MODE=token`, the default of local clusters since Ray 2.59): Ray sends a token
to an explicit address only when this process's `RAY_AUTH_MODE` is `token`, and a cluster that wants one
refuses the connection for 20 s of retries, with an error that names neither the mode nor the token. One RPC
to the GCS (`_check_token_auth`) tells at once whether the cluster refuses this process, and the line names
the fix: the mode, and where Ray looks for the token (RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names,
~/.ray/auth_token).
qbatch never sends a token Ray itself would not.
"""

from __future__ import annotations

import os
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


def _check_reachable(address: str, timeout_s: float = 5.0, token: bool = True) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) address where nothing accepts a connection.

    Ray itself retries such an address for minutes (its GCS client) before it fails with a timeout; one TCP
    connect tells the user at once. "auto" is checked at the address Ray resolves it to (`_auto_ray_address`):
    a driver killed before it shut its local Ray down leaves its record behind, and a Ray in another network
    namespace shows its GCS process; "auto" would then hang for minutes. "local" is Ray's; a malformed address
    is left to Ray's parser, whose error the caller reports. With `token`, a Ray's GCS that refuses this
    process for want of its token is refused too (`_check_token_auth`).
    """
    if address == "auto":
        found = _auto_ray_address()
        if found:
            try:
                _check_reachable(found, timeout_s, token=False)
            except UsageError:
                raise UsageError(
                    f"`--address` 'auto': the Ray it finds ({found}: RAY_ADDRESS, the address the last Ray "
                    "on this machine recorded, or a running GCS process) does not answer; is that Ray gone "
                    "(a run killed before it shut its Ray down leaves its record), or in another network "
                    "namespace? Start one with `ray start --head`, or leave --address out for a local "
                    "Ray") from None
            if token:
                _check_token_auth("auto", found, timeout_s)
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
            f"`--address` {address!r}: {host}:{port} answers as a web server (HTTP/1) does, such as Ray's "
            "dashboard (the address `ray job submit` takes), not Ray's GCS; give the address `ray start "
            "--head` printed (port 6379 by default), or 'auto' on a node of the cluster")
    if token and "://" not in address:  # a GCS address (a "ray://" client server speaks another protocol)
        _check_token_auth(address, f"{host}:{port}", timeout_s)


#: where Ray looks for the token, in its order, and how to get the cluster's
_TOKEN_SOURCES = ("RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token (`ray "
                  "get-auth-token` on the cluster's head prints its token)")
#: the GCS's cheapest RPC, the first a Ray client calls (an empty request)
_GCS_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"
#: what Ray's GCS answers a connection without the right token (its retries log it; `ray.init` drops it)
_REFUSED_TOKEN = ("InvalidAuthToken", "Authentication token is missing or incorrect")


def _local_token() -> tuple[str, str] | None:
    """The token Ray would send from this process, and where it came from, in Ray's order: the RAY_AUTH_TOKEN
    variable, the file RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token; None when there is none."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    path, where = ((named, f"RAY_AUTH_TOKEN_PATH's file {named}") if named else
                   (os.path.expanduser("~/.ray/auth_token"), "~/.ray/auth_token"))
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return (text, where) if text else None


def _sends_token(address: str, token: tuple[str, str] | None) -> bool:
    """Whether `ray.init(address)` in this process sends a token: `RAY_AUTH_MODE=token`, or (Ray's own rule)
    the mode unset, the address "auto" and a token at hand."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.strip().lower() == "token"
    return address == "auto" and token is not None


def _token_refused_line(address: str, target: str, sends: bool, token: tuple[str, str] | None) -> str:
    """The one line for a Ray at `target` that refused this process's token, or its lack of one."""
    head = f"`--address` {address!r}: the Ray at {target} requires token authentication"
    if sends and token is not None:
        return (f"{head} and refuses this process's token (from {token[1]}); give it the cluster's token in "
                f"{_TOKEN_SOURCES}")
    mode = os.environ.get("RAY_AUTH_MODE")
    now = f" (it is {mode!r} here)" if mode is not None else ""
    if token is not None:
        return (f"{head}, and this process sends no token: set RAY_AUTH_MODE=token{now} to send the one in "
                f"{token[1]}, if it is the cluster's; else put the cluster's token in {_TOKEN_SOURCES}")
    return (f"{head}, and this process sends no token: set RAY_AUTH_MODE=token{now}, with the cluster's "
            f"token in {_TOKEN_SOURCES}")


def _check_token_auth(address: str, target: str, timeout_s: float = 5.0) -> None:
    """Refuse, in one line naming the fix, a Ray whose GCS at `target` ("host:port") refuses this process: it
    sends no token and the cluster wants one, or it sends one the cluster does not take. One RPC with the
    token Ray would send (none where Ray would send none); anything else it meets (no grpc, TLS, an older Ray)
    leaves it to Ray. `RAY_AUTH_MODE=token` with no token at all is refused without a probe, as Ray refuses it
    (after lines of its own log)."""
    token = _local_token()
    sends = _sends_token(address, token)
    if sends and token is None:
        raise UsageError(f"`--address` {address!r}: RAY_AUTH_MODE is 'token' here, but this process has no "
                         f"token: put the cluster's token in {_TOKEN_SOURCES}")
    try:
        import grpc

        metadata = [("authorization", f"Bearer {token[0]}")] if sends and token is not None else None
        with grpc.insecure_channel(target) as channel:
            channel.unary_unary(_GCS_PROBE)(b"", timeout=timeout_s, metadata=metadata)
    except ImportError:
        return
    except Exception as exc:  # noqa: BLE001 - grpc.RpcError, or whatever a probe meets: Ray decides
        code = getattr(exc, "code", None)
        if callable(code) and getattr(code(), "name", "") == "UNAUTHENTICATED":
            raise UsageError(_token_refused_line(address, target, sends, token)) from None
        return


def _token_refusal(address: str, exc: BaseException) -> str | None:
    """For `ray.init`'s connection error: the one line of `_token_refused_line` when Ray's GCS refused this
    process's token (its reason is in the error's causes, in a traceback's text), else None."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if not any(mark in text for mark in _REFUSED_TOKEN):
        return None
    token = _local_token()
    return _token_refused_line(address, address, _sends_token(address, token), token)


#: the HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4): what a gRPC client sends first
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _answers_http1(conn: socket.socket, timeout_s: float) -> bool:
    """Whether the server on `conn` answers a gRPC client's first bytes in text, as an HTTP/1 server does
    ("HTTP/1.1 400 ...", or an HTML error page). Ray's GCS and client server speak gRPC (HTTP/2) and answer
    with a binary SETTINGS frame (a TLS server with a binary alert). The dashboard's port (8265, which the
    README's `ray job submit` uses) passes the connect check, and `ray.init` then waits 14 minutes. No answer,
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
