"""The ledger of finished work: extract/finished.jsonl, one JSON record per finished sample (both tracks).

A record is appended (and fsync'ed) only after the sample's file is complete and validated, so the ledger never
names a file that is not there. `append` takes several records at once (a group commit: one write, one fsync);
a record counts as finished only once its `append` has returned, so a kill before the fsync loses only records
that nothing reported as done yet. A kill during an append leaves a torn last line: `read` ignores it, and with
REPAIR cuts it off the file so that the next append starts on a line of its own. Every record has the sample's
"id" (an int), "tokens", "size" (bytes) and "sha256" of its file; a track may add int FIELDS (e.g. "index").
"""

import json
import os

from specdec_pipeline.fsutil import atomic_path
from specdec_pipeline.progress import log

FIELDS = {"id": int, "tokens": int, "size": int, "sha256": str}


def read(path, repair=False, extra=()):
    """{id: record} from the ledger at PATH (the last record of an id wins); {} when there is none.

    Lines that are not a record (a torn last line, a damaged line) are skipped; EXTRA names further int fields
    each record must carry."""
    done = {}
    if not path.exists():
        return done
    raw = path.read_bytes()
    keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
    if repair and keep != raw:
        log.info("extract: cutting a torn last line (%d bytes) off %s", len(raw) - len(keep), path)
        with open(path, "r+b") as f:
            f.truncate(len(keep))
            os.fsync(f.fileno())
    kinds = {**FIELDS, **dict.fromkeys(extra, int)}
    for line in keep.splitlines():
        try:
            rec = json.loads(line)
            rec = {key: kind(rec[key]) for key, kind in kinds.items()}
        except (ValueError, KeyError, TypeError):
            continue
        done[rec["id"]] = rec
    return done


def append(path, *records):
    """Append RECORDS, one line each, in one write and one fsync (a group commit); when it returns, all of them are
    on disk. An OSError names PATH."""
    if not records:
        return
    try:
        with open(path, "a") as f:
            f.write("".join(json.dumps(rec, separators=(",", ":")) + "\n" for rec in records))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        exc.filename = exc.filename or str(path)
        raise


def rewrite(path, records):
    """Replace the ledger atomically with RECORDS ({id: record}), in id order."""
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for dummy, r in sorted(records.items())))
