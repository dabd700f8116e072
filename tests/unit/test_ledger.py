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
