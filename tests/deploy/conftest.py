"""A real redis-server for the online store's Redis backend, once per session (testkit/local_redis.py:
installed if missing, loopback, a free port, stopped by its PID even on failure)."""

import pytest

from testkit.local_redis import local_redis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    with local_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url
