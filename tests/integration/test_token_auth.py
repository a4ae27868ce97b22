"""A Ray under token authentication, as users run it: `ray start --head` with `RAY_AUTH_MODE=token` (the
default of local clusters since Ray 2.59), and `qbatch run --address HOST:PORT` connecting to it through
`run_experiment`'s address path. With the mode and the token the run goes through; without the token, with a
wrong one, or with the mode and no token, it is one line naming the fix, before Ray's 20 s of retries. Run
inside scripts/loopback.

The head and each `qbatch` process run in their own processes, with their own environment: Ray reads the mode
once per process. Each gets a HOME of its own, so no token of this machine's ~/.ray is read or written.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
#: the one-line failures must come well before Ray's own 20 s of retries
FAIL_FAST_S = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> str:
    here = Path(sys.executable).with_name("ray")
    return str(here) if here.exists() else (shutil.which("ray") or pytest.skip("no `ray` command"))


def _env(home: Path, **over: str) -> dict[str, str]:
    """This process's environment without Ray's auth variables, with its own HOME, this checkout first on the
    path (the head's workers import qbatch from it too), and `over`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_") and k != "RAY_ADDRESS"}
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home), PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    )
    env.update(over)
    return env


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    """A one-node Ray with token authentication, started by `ray start --head --block` in a session of its own
    (ended as a group at the end); yields (address, token)."""
    ray = pytest.importorskip("ray")
    if not hasattr(ray.exceptions, "AuthenticationError"):
        pytest.skip(f"Ray {ray.__version__} has no token authentication (2.52 and later)")
    root = tmp_path_factory.mktemp("token-head")
    temp_dir = tempfile.mkdtemp(prefix="qb-tok-", dir="/tmp")  # Ray's socket paths must stay short
    token, port = secrets.token_hex(32), _free_port()
    env = _env(root / "home", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    log = open(root / "head.log", "w")
    head = subprocess.Popen(
        [
            _ray_cli(),
            "start",
            "--head",
            "--block",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--include-dashboard",
            "false",
            "--node-ip-address",
            "127.0.0.1",
            "--temp-dir",
            temp_dir,
            "--disable-usage-stats",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while not _answers(address, token):
            if head.poll() is not None or time.time() > deadline:
                log.flush()
                pytest.fail(f"the token head did not start: {(root / 'head.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield address, token
    finally:
        # `ray start --block` may sit in a GCS call that a SIGTERM does not cut short: the group is killed
        # after a grace
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(head.pid, sig)
                head.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _answers(address: str, token: str) -> bool:
    """Whether the GCS at `address` answers an RPC that carries `token`."""
    import grpc

    try:
        with grpc.insecure_channel(address) as channel:
            channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")(
                b"", timeout=2, metadata=[("authorization", f"Bearer {token}")])
        return True
    except grpc.RpcError:
        return False


def _qbatch_run(
    tmp_path: Path, name: str, address: str, **env: str
) -> tuple[subprocess.CompletedProcess, float]:
    cfg = {
        "name": name,
        "objective": {"name": "sleep", "options": {"mean_s": 0.05, "cv": 0.0, "num_cpus": 1}},
        "budget": 6,
        "initial_design": 6,
        "batch_size": 6,
        "max_concurrent": 2,
        "run_dir": str(tmp_path / name),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", str(path), "--address", address],
        env=_env(tmp_path / f"home-{name}", **env),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    return done, time.time() - t0


@pytest.mark.ray
def test_a_run_connects_to_a_token_cluster_by_address(token_head, tmp_path):
    address, token = token_head
    done, _ = _qbatch_run(tmp_path, "with-token", address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "qbatch: finished: 6 evaluations (6 completed, 0 failed)" in done.stdout


@pytest.mark.ray
@pytest.mark.parametrize("env, expected", [
    ({}, "requires token authentication, and this process sends no token: set RAY_AUTH_MODE=token, with the "
         "cluster's token in RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token"),
    ({"RAY_AUTH_TOKEN": "0" * 64}, "sends no token: set RAY_AUTH_MODE=token to send the one in "
                                   "RAY_AUTH_TOKEN"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
     "requires token authentication and refuses this process's token (from RAY_AUTH_TOKEN)"),
    ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE is 'token' here, but this process has no token: put the "
                                 "cluster's token in RAY_AUTH_TOKEN"),
], ids=["no-token", "token-without-mode", "wrong-token", "mode-without-token"])
def test_a_refused_connection_is_one_line_naming_the_fix(token_head, tmp_path, env, expected):
    address, _ = token_head
    done, seconds = _qbatch_run(tmp_path, "refused", address, **env)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(err) == 1 and err[0].startswith("qbatch: error: `--address` "
                                               f"'{address}': "), done.stderr[-3000:]
    assert expected in err[0]
    assert seconds < FAIL_FAST_S + 10  # the import of qbatch included; Ray alone retries for 20 s
    assert not (tmp_path / "refused").exists()


def test_the_token_is_read_where_ray_reads_it(tmp_path, monkeypatch):
    from orchestrator.runner.address import _local_token, _sends_token

    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _local_token() is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc\n")
    assert _local_token() == ("abc", "~/.ray/auth_token")
    (tmp_path / "t").write_text("def")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    assert _local_token() == ("def", f"RAY_AUTH_TOKEN_PATH's file {tmp_path / 't'}")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ghi")
    assert _local_token() == ("ghi", "RAY_AUTH_TOKEN")
    # Ray's rule: an explicit address gets a token only with the mode; "auto" also without it, where one is at
    # hand
    assert not _sends_token("10.0.0.1:6379", ("ghi", "RAY_AUTH_TOKEN")) and _sends_token("auto", ("g", "x"))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert _sends_token("10.0.0.1:6379", ("ghi", "RAY_AUTH_TOKEN"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert not _sends_token("auto", ("ghi", "RAY_AUTH_TOKEN"))


def test_rays_own_connection_error_for_a_refused_token_gets_the_same_line(monkeypatch):
    """Where the probe could not tell (it met something else), Ray's error after its retries still gets the
    line: the GCS's reason is in the text of the error's causes."""
    from orchestrator.runner.address import _token_refusal

    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    try:
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: Traceback ...\n"
                               "RpcError: Unauthenticated: RPC error: InvalidAuthToken: Authentication token "
                               "is missing or incorrect")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6390") from cause
    except ConnectionError as exc:
        line = _token_refusal("127.0.0.1:6390", exc)
    assert line.startswith("`--address` '127.0.0.1:6390': the Ray at 127.0.0.1:6390 requires token "
                           "authentication")
    assert "set RAY_AUTH_MODE=token" in line and "\n" not in line
    assert _token_refusal("x:1", ConnectionError("Could not find any running Ray instance.")) is None
