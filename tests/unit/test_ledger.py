"""The one ledger of finished extraction work (specdec_pipeline.ledger, both tracks): a torn last line - what a kill
during an append leaves - is ignored, and cut off before the next append so that no record is lost to it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "eagle3_pipeline" / "files"))
sys.dont_write_bytecode = True  # the role copies files/ to the host: no __pycache__ there

from specdec_pipeline import ledger  # noqa: E402


def rec(i, **extra):
    return {"id": i, "tokens": 10 + i, "size": 100 + i, "sha256": f"{i:064x}", **extra}


def test_a_torn_last_line_is_cut_off_and_the_next_record_kept(tmp_path):
    path = tmp_path / "finished.jsonl"
    ledger.append(path, rec(0))
    ledger.append(path, rec(1))
    with open(path, "a") as f:
        f.write(json.dumps(rec(2))[:17])  # the kill came in the middle of the third append
    assert sorted(ledger.read(path)) == [0, 1]
    assert sorted(ledger.read(path, repair=True)) == [0, 1]
    assert path.read_bytes().endswith(b"\n")
    ledger.append(path, rec(3))
    assert sorted(ledger.read(path)) == [0, 1, 3]  # without the repair, record 3 would be glued to the torn line


def test_records_are_typed_and_a_track_may_add_fields(tmp_path):
    path = tmp_path / "finished.jsonl"
    path.write_text(json.dumps({"id": "4", "tokens": 3, "size": 9, "sha256": "ab"}) + "\n"
                    + json.dumps({"id": 5, "tokens": 3}) + "\n"  # not a record: skipped
                    + json.dumps(rec(6, index=2)) + "\n")
    assert ledger.read(path) == {4: {"id": 4, "tokens": 3, "size": 9, "sha256": "ab"},
                                 6: {"id": 6, "tokens": 16, "size": 106, "sha256": f"{6:064x}"}}
    assert ledger.read(path, extra=("index",)) == {6: rec(6, index=2)}
    ledger.rewrite(path, {6: rec(6, index=2), 1: rec(1, index=0)})
    assert [json.loads(x)["id"] for x in path.read_text().splitlines()] == [1, 6]
    assert ledger.read(tmp_path / "absent.jsonl") == {}


def test_a_group_commit_is_one_fsync_for_all_its_records(tmp_path, monkeypatch):
    path = tmp_path / "finished.jsonl"
    synced = []
    real_fsync = ledger.os.fsync
    monkeypatch.setattr(ledger.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    ledger.append(path, rec(0), rec(1), rec(2))
    assert len(synced) == 1  # one fsync for the three records, not one each
    ledger.append(path)  # nothing to commit: nothing written, no fsync
    ledger.append(path, rec(3))
    assert len(synced) == 2
    assert sorted(ledger.read(path)) == [0, 1, 2, 3]
    assert path.read_bytes().count(b"\n") == 4


# A child that commits group A, says which records it may report as done, then dies by SIGKILL inside the fsync of
# group B (between its write and its fsync): what was acknowledged is there, B is there whole or not at all.
KILLED_IN_FSYNC = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from specdec_pipeline import ledger
rec = lambda i: {"id": i, "tokens": 1, "size": 1, "sha256": "0" * 64}
ledger.append(sys.argv[1], rec(0), rec(1), rec(2))
print("acknowledged 0 1 2", flush=True)
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
ledger.append(sys.argv[1], rec(3), rec(4), rec(5))
print("acknowledged 3 4 5", flush=True)
"""


def test_a_kill_between_a_group_write_and_its_fsync_loses_only_unacknowledged_records(tmp_path):
    import signal  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    path = tmp_path / "finished.jsonl"
    proc = subprocess.run([sys.executable, "-c", KILLED_IN_FSYNC, str(path), str(ROOT / "roles" / "eagle3_pipeline" / "files")],
                          capture_output=True, text=True, check=False, env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    acknowledged = {int(i) for line in proc.stdout.splitlines() for i in line.split()[1:]}
    assert acknowledged == {0, 1, 2}
    after = set(ledger.read(path, repair=True))
    assert acknowledged <= after  # nothing that was reported done is lost
    assert after - acknowledged in (set(), {3, 4, 5})  # the unacknowledged group: whole or not at all
    ledger.append(path, rec(6))  # the re-run goes on: the next group starts on a line of its own
    assert set(ledger.read(path)) == after | {6}
