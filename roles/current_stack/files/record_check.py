"""Check installed distributions against their wheel's RECORD: python record_check.py DIST [DIST ...]

Prints one JSON object {"checked": N, "modified": [{"dist", "path", "why"}], "summary": "..."} and exits 1 when a
file recorded with a hash is missing or has another size or sha256 (e.g. a source patch left behind), 2 when a
distribution is not installed, else 0. Files without a recorded hash (RECORD itself, bytecode) are skipped.
"""

import base64
import hashlib
import importlib.metadata as md
import json
import sys


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def check(names):
    checked, modified, missing = 0, [], []
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            missing.append(name)
            continue
        for rec in dist.files or []:
            if rec.hash is None or rec.hash.mode != "sha256":
                continue
            path = rec.locate()
            checked += 1
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                modified.append({"dist": name, "path": str(rec), "why": "missing"})
                continue
            if rec.size is not None and size != rec.size:
                modified.append({"dist": name, "path": str(rec), "why": f"size {size}, recorded {rec.size}"})
            elif file_digest(path) != rec.hash.value:
                modified.append({"dist": name, "path": str(rec), "why": "sha256 differs from RECORD"})
    return checked, modified, missing


def main(argv):
    checked, modified, missing = check(argv)
    versions = {}
    for name in argv:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    where = ", ".join(f"{k} {v}" for k, v in versions.items())
    if missing:
        summary = f"not installed: {', '.join(missing)}"
    elif modified:
        summary = f"{len(modified)} of {checked} files differ from the released ones ({where})"
    else:
        summary = f"all {checked} recorded files of {where} are the released ones (nothing patched)"
    print(json.dumps({"checked": checked, "modified": modified, "missing": missing, "versions": versions,
                      "summary": summary}))
    return 2 if missing else (1 if modified else 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
