"""Fixtures of the data tests; their helpers are in data_helpers.py."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture
def write(tmp_path):
    """write(name, data) -> path of a file in the test's temporary directory."""
    def _write(name, data):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        return str(path)
    return _write
