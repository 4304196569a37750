"""A throwaway redis-server on loopback (tests and benchmarks of the Redis online store): the Debian
package is installed if missing, the server binds 127.0.0.1 on a free port, persists nothing, and is
stopped by its PID however the caller exits."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        subprocess.run("apt-get update -qq && apt-get install -y -qq redis-server", shell=True, check=True,
                       capture_output=True, timeout=600)
        found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is not installed and apt-get could not install it")
    return found


@contextmanager
def local_redis(workdir: Path) -> Iterator[str]:
    """Yields the server's redis:// URL."""
    import redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
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
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
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
