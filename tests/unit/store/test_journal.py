"""The ACK journal (:mod:`broker.store.journal`) on real files: what a listener appends is applied
by a recovery once that listener is gone (never while it lives), in order, with a torn last
record dropped; applied segments are deleted."""

from __future__ import annotations

import os

import pytest

from broker.store import journal
from broker.store.journal import RECORD, AckJournal, recover

RECORDS = [(7, 100 + i, 1 + i % 3, i % 2 == 0, journal.DOORS[i % 3]) for i in range(50)]


def files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_live_journal_is_not_recovered_a_closed_one_is_in_order(tmp_path):
    live = AckJournal(tmp_path)
    live.append(RECORDS[:20])
    live.append(RECORDS[20:])
    applied: list = []
    # Its lock is held (by this process, through another open file): not an orphan.
    assert recover(tmp_path, applied.extend) == 0
    assert applied == []
    live.close()  # with records not applied: the segment stays for recovery
    assert len(files(tmp_path)) == 1
    assert recover(tmp_path, applied.extend) == len(RECORDS)
    assert applied == RECORDS
    assert files(tmp_path) == []


def test_recovery_applies_in_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "RECOVERY_BATCH", 16)
    dead = AckJournal(tmp_path)
    dead.append(RECORDS)
    dead.close()
    batches: list[list] = []
    assert recover(tmp_path, batches.append) == len(RECORDS)
    assert [len(b) for b in batches] == [16, 16, 16, 2]
    assert [r for b in batches for r in b] == RECORDS


def test_a_torn_last_record_is_dropped(tmp_path):
    dead = AckJournal(tmp_path)
    dead.append(RECORDS[:3])
    path = dead._current.path
    dead.close()
    with path.open("ab") as file:  # the writer died in the middle of a record
        file.write(RECORD.pack(9, 999, 1, 0)[:10])
    applied: list = []
    assert recover(tmp_path, applied.extend) == 3
    assert applied == RECORDS[:3]


def test_a_write_that_fails_midway_leaves_no_torn_record_behind(tmp_path, monkeypatch):
    """A full disk after part of a record: that append raises (no 310 ACK), and the
    segment is cut back, so the records appended after it are read back whole."""
    live = AckJournal(tmp_path)
    live.append(RECORDS[:2])
    real_write = os.write

    def half_then_full(fd, data):
        monkeypatch.setattr(os, "write", real_write)  # the disk fills up after this
        real_write(fd, bytes(data[:RECORD.size // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        live.append(RECORDS[2:3])
    live.append(RECORDS[3:5])
    live.close()
    applied: list = []
    assert recover(tmp_path, applied.extend) == 4
    assert applied == RECORDS[:2] + RECORDS[3:5]


def test_a_failed_recovery_keeps_the_segment(tmp_path):
    dead = AckJournal(tmp_path)
    dead.append(RECORDS[:5])
    dead.close()

    def broken(records):
        raise RuntimeError("database down")

    assert recover(tmp_path, broken) == 0
    assert len(files(tmp_path)) == 1
    applied: list = []
    assert recover(tmp_path, applied.extend) == 5
    assert applied == RECORDS[:5]


def test_applied_segments_are_deleted_and_a_caught_up_one_starts_over(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "SEGMENT_BYTES", RECORD.size * 10)
    live = AckJournal(tmp_path)
    live.append(RECORDS[:10])  # fills the first segment: the next one is started
    live.append(RECORDS[10:15])
    assert len(files(tmp_path)) == 2
    live.applied(9)
    assert len(files(tmp_path)) == 2  # one record of the first segment still to apply
    live.applied(1)
    assert len(files(tmp_path)) == 1
    current = tmp_path / files(tmp_path)[0]
    assert current.stat().st_size == 5 * RECORD.size
    live.applied(5)  # everything applied, and the segment is a quarter full or more
    assert current.stat().st_size == 0
    live.append(RECORDS[15:17])
    assert current.read_bytes() == journal.pack(RECORDS[15:17])
    live.applied(2)
    live.close()  # nothing pending: nothing left behind
    assert files(tmp_path) == []


def test_an_unlocked_temporary_segment_is_cleared(tmp_path):
    (tmp_path / ".abandoned.tmp").write_bytes(b"")  # a creator that died before its rename
    assert recover(tmp_path, lambda records: None) == 0
    assert files(tmp_path) == []


def test_the_flusher_syncs_on_its_own_descriptors(tmp_path):
    live = AckJournal(tmp_path)
    live.append(RECORDS[:2])
    flush = live.flusher()
    before = len(os.listdir("/proc/self/fd"))
    flush()
    assert len(os.listdir("/proc/self/fd")) == before - 1  # it closed its duplicate
    live.applied(2)
    live.close()


@pytest.mark.parametrize("other", [{"NAME": "other.sqlite3"}, {"HOST": "db2"}])
def test_each_database_has_a_folder_of_its_own(other):
    base = {"ENGINE": "django.db.backends.sqlite3", "HOST": "", "PORT": "", "NAME": "a.sqlite3"}
    assert journal.directory(base) == journal.directory(dict(base))
    assert journal.directory(base) != journal.directory({**base, **other})
