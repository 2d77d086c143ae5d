"""Issue 30: long operator commands show progress. ``manage.py grant`` with many accounts
(a bulk grant from a file), run as an operator would, in a process of its own."""

from __future__ import annotations

import pytest

from tests.conftest import fresh_database, query_database, run_manage

pytestmark = pytest.mark.e2e

MANY = 250

SETUP = f"""
from accounts.models import Account
from topics.models import Topic
Account.objects.bulk_create([Account(username=f"user{{i}}", username_key=f"user{{i}}")
                             for i in range({MANY})])
Topic.objects.create(path="/bulk")
"""


def entries(env) -> int:
    """The subscribe entries on /bulk, read from the database (not another process)."""
    [(count,)] = query_database(
        env, "SELECT COUNT(*) FROM ual_ualentry e JOIN topics_topic t ON t.id = e.topic_id"
             " WHERE t.path = %s AND e.\"right\" = %s", ("/bulk", "subscribe"))
    return count


def test_bulk_grant_from_a_file_shows_progress(tmp_path):
    with fresh_database("sqlite", tmp_path, setup=SETUP) as env:
        names = tmp_path / "accounts.txt"
        names.write_text("# the class of 2026\n" + "\n".join(f"user{i}" for i in range(MANY))
                         + "\nUSER0\n")  # a repeat, in another case: granted once
        result = run_manage(env, "grant", f"@{names}", "/bulk", "subscribe")
        assert result.stdout.strip() == f"granted subscribe on /bulk to {MANY} accounts"
        progress = result.stderr.strip().splitlines()
        # Not a terminal: a line per tenth of the work, the last one complete.
        assert progress[-1] == f"granting on /bulk: {MANY}/{MANY} (100%)"
        assert 3 <= len(progress) <= 11
        assert entries(env) == MANY

        # An unknown name stops it before anything changes.
        bad = run_manage(env, "grant", "user1,nobody,user2", "/bulk", "publish", check=False)
        assert bad.returncode != 0 and "no account named 'nobody'" in bad.stderr
        # One account: the one-line answer as before, no progress.
        one = run_manage(env, "grant", "user7", "/bulk", "subscribe", "--revoke")
        assert one.stdout.strip() == "revoked subscribe on /bulk to user7"
        assert one.stderr.strip() == ""
        assert entries(env) == MANY - 1
