"""Download and cache real upstream release files from the package index.

Tests and molecule scenarios use the real speculators wheels and vLLM sources/wheels, never hand-written
look-alikes.  Files are cached under ``.cache/upstream`` (git-ignored) and checked against the sha256
that the index publishes (PEP 691 JSON simple API), so a cached file is trusted only while it matches.

CLI::

    python tests/support/upstream.py speculators==0.3.0:wheel vllm==0.16.0:sdist ...

prints one cached path per argument.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECDEC_UPSTREAM_CACHE", ROOT / ".cache" / "upstream"))
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
ACCEPT = "application/vnd.pypi.simple.v1+json"


class UpstreamError(RuntimeError):
    pass


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _index_files(project: str) -> list[dict]:
    req = urllib.request.Request(f"{INDEX}/{_normalise(project)}/", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - index URL is https
        return json.load(resp)["files"]


def _pick(files: list[dict], project: str, version: str, kind: str) -> dict:
    stem = _normalise(project).replace("-", "_")
    for entry in files:
        fname = entry["filename"]
        low = fname.lower().replace("-", "_")
        if kind == "sdist" and low == f"{stem}_{version}.tar.gz":
            return entry
        if kind == "wheel" and low.startswith(f"{stem}_{version}_") and fname.endswith(".whl"):
            if "py3-none-any" in fname or "manylinux" in fname and "x86_64" in fname:
                return entry
    raise UpstreamError(f"{project}=={version}: no {kind} found on {INDEX}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(project: str, version: str, kind: str = "wheel") -> Path:
    """Return the cached path of ``project==version`` (``kind`` is ``wheel`` or ``sdist``)."""
    meta_path = CACHE / f"{_normalise(project)}-{version}.{kind}.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        cached = CACHE / meta["filename"]
        if cached.exists() and _sha256(cached) == meta["sha256"]:
            return cached
    entry = _pick(_index_files(project), project, version, kind)
    want = entry["hashes"]["sha256"]
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / entry["filename"]
    if not (target.exists() and _sha256(target) == want):
        fd, tmp = tempfile.mkstemp(dir=CACHE, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(entry["url"], timeout=600) as resp:  # noqa: S310
                shutil.copyfileobj(resp, out, 1 << 20)
            got = _sha256(Path(tmp))
            if got != want:
                raise UpstreamError(f"{entry['filename']}: sha256 {got} != index {want}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    meta_path.write_text(json.dumps({"filename": entry["filename"], "sha256": want}))
    return target


def main(argv: list[str]) -> int:
    for spec in argv:
        req, _unused, kind = spec.partition(":")
        project, _unused, version = req.partition("==")
        print(fetch(project, version, kind or "wheel"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
