"""A real redis-server for the online store's Redis backend: installed if missing (Debian package),
bound to loopback on a free port, started once per session and stopped by its PID."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


def _redis_server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        subprocess.run("apt-get update -qq && apt-get install -y -qq redis-server", shell=True, check=True,
                       capture_output=True, timeout=600)
        found = shutil.which("redis-server")
    assert found, "redis-server is not installed and apt-get could not install it"
    return found


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    import redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([_redis_server(), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        deadline = time.time() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None and time.time() < deadline, "redis-server did not start"
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
