"""Small valid pure-Python wheels and PEP 503 file indexes built in a test's folder (no network, no build tools), and
the pinned uv's real wheel, cached outside the checkout."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
UV_VERSION = yaml.safe_load((ROOT / "roles" / "ml_venv" / "defaults" / "main.yml").read_text())["ml_venv_uv_version"]
# Outside the checkout, where CI caches its downloads, so that a fresh clone reuses it; filled once by pip download.
UV_CACHE = Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec-eagle3") / "uv-wheel"


def wheel(folder: Path, name: str = "tinypkg", version: str = "1.0", requires: tuple[str, ...] = ()) -> Path:
    """The wheel NAME VERSION (one module NAME with VALUE = VERSION; Requires-Dist REQUIRES) in FOLDER; returns its
    path."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {f"{module}/__init__.py": f"VALUE = {version!r}\n".encode(),
             f"{dist}.dist-info/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                            + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for p, d in files.items()] + [f"{dist}.dist-info/RECORD,,"]
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


def file_index(root: Path, name: str, versions: list[str]) -> str:
    """A PEP 503 simple index under ROOT holding NAME at VERSIONS (each link with its sha256); returns its file:// URL."""
    files = root / "files"
    links = []
    for version in versions:
        whl = wheel(files, name, version)
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        links.append(f'<a href="../../files/{whl.name}#sha256={digest}">{whl.name}</a>')
    page = root / "simple" / name
    page.mkdir(parents=True, exist_ok=True)
    (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (root / "simple" / "index.html").write_text(f'<!DOCTYPE html><html><body><a href="{name}/">{name}</a></body></html>\n')
    return f"file://{root}/simple"


def uv_wheel() -> Path:
    """The pinned uv's wheel for this machine, downloaded once into UV_CACHE; skips when it cannot be had."""
    def cached():
        return sorted(UV_CACHE.glob(f"uv-{UV_VERSION}-*.whl"))
    if not cached():
        UV_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", str(UV_CACHE), f"uv=={UV_VERSION}"],
                       capture_output=True, check=False, timeout=300)
    if not cached():
        pytest.skip(f"uv {UV_VERSION}'s wheel is neither in {UV_CACHE} nor downloadable (pip download uv=={UV_VERSION})")
    return cached()[0]
