"""Rewrite a wheel without the members under the given prefixes, uncompressed (ZIP_STORED), with its RECORD
rewritten to match: what is left installs and verifies as the release's own files.

    python3 tests/gpu/prune_wheel.py IN.whl OUT.whl PREFIX [PREFIX ...]

vLLM's CUDA wheel (about 450 MB) carries FlashAttention-2 and SM100 FMHA sources that a Hopper machine never
loads; without them, and stored uncompressed so that zstd packs the whole (about 135 MB), it travels to a GPU
machine that takes a limited upload per command. The members keep their order and timestamps: the same input
gives the same bytes.
"""
import sys
import zipfile


def main(src: str, dest: str, prefixes: list[str]) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        names = zin.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        dropped = 0
        for info in zin.infolist():
            if any(info.filename.startswith(p) for p in prefixes):
                dropped += 1
                continue
            data = zin.read(info)
            if info.filename == record:
                lines = data.decode("utf-8").splitlines(keepends=True)
                data = "".join(ln for ln in lines if not any(ln.startswith(p) for p in prefixes)).encode("utf-8")
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr = info.external_attr
            out.compress_type = zipfile.ZIP_STORED
            zout.writestr(out, data)
    if not dropped:
        sys.exit(f"prune_wheel.py: nothing in {src} starts with {prefixes}")
    print(f"{dest}: {dropped} members left out")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
