"""Spread the files of SRC over bundles DEST/b1, b2, ... of at most CAP bytes each, largest file first into the
first bundle with room; each bundle gets the MANIFEST of all files (sha256, relative path), so the GPU machine can
tell when every bundle has arrived and check them all.

    python3 tests/gpu/bundle.py SRC DEST CAP_BYTES
"""
import hashlib
import shutil
import sys
from pathlib import Path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(src: Path, dest: Path, cap: int) -> None:
    files = sorted((p for p in src.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)
    bundles = []  # [used bytes, [relative names]]
    for path in files:
        size, name = path.stat().st_size, str(path.relative_to(src))
        if size > cap:
            sys.exit(f"bundle.py: {name} ({size} bytes) is larger than a bundle ({cap} bytes); split it first")
        for bundle in bundles:
            if bundle[0] + size <= cap:
                bundle[0] += size
                bundle[1].append(name)
                break
        else:
            bundles.append([size, [name]])
    manifest = "".join(f"{sha256(src / n)}  {n}\n" for b in bundles for n in b[1])
    for i, (used, names) in enumerate(bundles, 1):
        folder = dest / f"b{i}"
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src / name), str(folder / name))
        (folder / "MANIFEST").write_text(manifest)
        print(f"b{i}: {used / 2**20:.1f} MiB, {len(names)} files")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
