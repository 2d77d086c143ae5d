"""A process that loaded the broker's Django project leaves the objects it holds out of the
collector's reach at exit (broker.heap.freeze_at_exit): the teardown of its modules then
frees them by reference counting instead of walking them in full collections."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, base_env
from tests.support.timing import scaled

pytestmark = pytest.mark.e2e

# atexit runs its handlers last registered, first run: this one, registered before Django
# loads the project, runs after the project's own and sees what they left.
SCRIPT = """
import atexit, gc, os
atexit.register(lambda: os.write(1, f"frozen at exit: {gc.get_freeze_count()}\\n".encode()))
import django
django.setup()
os.write(1, f"frozen before exit: {gc.get_freeze_count()}\\n".encode())
"""


def test_a_process_that_loaded_the_project_freezes_its_objects_at_exit(database_urls, tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                            text=True, timeout=scaled(60),
                            env=base_env(tmp_path, database_urls["sqlite"]))
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ") for line in result.stdout.splitlines())
    assert lines["frozen before exit"] == "0"  # serving, the collector sees everything
    assert int(lines["frozen at exit"]) > 50_000
