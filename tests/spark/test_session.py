"""build_session: the Java check (no Spark needed)."""

from __future__ import annotations

import pytest

from transforms.spark import session


def test_missing_java_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no java anywhere
    assert session.find_java() is None
    with pytest.raises(session.JavaNotFoundError, match=r"apt-get install -y openjdk-17-jre-headless"):
        session.build_session(master="local[1]")


def test_java_home_is_preferred(monkeypatch, tmp_path):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert session.find_java() == str(java)
