"""Fixtures of the storage-reliability tests: a real S3 server and a fault proxy.

``moto_server`` is started once per session as a separate process on 127.0.0.1
(port 0: the server picks a free one and prints it; readiness is that line plus a
TCP connect, polled under a deadline). Its output goes to a log file, never a
pipe, so a chatty server cannot block. Each test that wants S3 gets a fresh
prefix in one bucket, reached through its own :class:`FaultProxy`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from faultproxy import FaultProxy  # noqa: E402
from rhelpers import BUCKET, KEY, SECRET  # noqa: E402

STARTUP_SECONDS = 60.0


@dataclass
class MotoServer:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _moto_command() -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("moto_server")
    if found:
        return [found]
    return [sys.executable, "-m", "moto.server"]


def _wait_ready(proc: subprocess.Popen, log: Path, deadline: float) -> int:
    pattern = re.compile(rb"Running on http://127\.0\.0\.1:(\d+)")
    port = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        if port is None:
            m = pattern.search(log.read_bytes())
            if m:
                port = int(m.group(1))
        if port is not None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return port
            except OSError:
                pass
        time.sleep(0.05)  # polling interval, not a fixed wait
    raise RuntimeError(f"moto_server not ready after {STARTUP_SECONDS:.0f} s:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory) -> MotoServer:
    """A real moto S3 server process on 127.0.0.1 with the test bucket created."""
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION="us-east-1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*_moto_command(), "-H", "127.0.0.1", "-p", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    try:
        port = _wait_ready(proc, log, time.monotonic() + STARTUP_SECONDS)
        server = MotoServer(proc, port, log)
        import boto3

        s3 = boto3.client(
            "s3", endpoint_url=server.url, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
        )
        s3.create_bucket(Bucket=BUCKET)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def proxy(moto_server):
    """A fault proxy in front of the moto server (no faults until configured)."""
    p = FaultProxy(moto_server.port, seed=1234).start()
    yield p
    p.stop()


@pytest.fixture
def s3_url() -> str:
    """A fresh prefix in the test bucket."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"
