"""The publish-linger default as a new process reads it from broker/settings.py (a Python
process per case: the setting is read once, at import)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.timing import scaled


@pytest.mark.parametrize(("database_url", "expected"), [
    ("sqlite:////tmp/unused-linger-default.sqlite3", 4),
    ("postgres://postgres@127.0.0.1:5432/unused", 0),
    ])
def test_the_linger_default_follows_the_database(database_url, expected):
    """Measured: lingering helps SQLite's storage process and idles PostgreSQL's
    (broker/settings.py). The setting is read at import; nothing connects here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMQP_")}
    env.update(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="broker.settings")

    def linger() -> int:
        code = "from django.conf import settings; print(settings.SMQP_PUBLISH_LINGER_MS)"
        return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, check=True, timeout=scaled(60)).stdout)

    assert linger() == expected
    env["SMQP_PUBLISH_LINGER_MS"] = "7"  # an explicit setting wins on either
    assert linger() == 7
