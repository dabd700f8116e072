"""Compile the venv's Python files to bytecode where the .pyc is missing or out of date; print a JSON summary.

Run with the venv's own interpreter (its magic number is the one the .pyc files must carry). uv does not compile
at install time, and the pipeline user may not write into root's venv, so without this every process that
imports vLLM, torch or transformers compiles their sources again (seconds per process, four processes per vLLM
server). A .pyc is up to date when it carries this interpreter's magic number and the source's modification time
and size (what the import system checks); hash-based .pyc files are left as they are. Files that do not compile
(test data written for Python 2, say) are counted, never fatal.

    bytecode.py [--check] DIR...     --check: compile in memory only and write nothing ("compiled" then counts
                                     what a real run would write)
"""
import importlib.util
import json
import multiprocessing
import os
import py_compile
import sys

MAGIC = importlib.util.MAGIC_NUMBER


def up_to_date(src):
    try:
        st = os.stat(src)
        with open(importlib.util.cache_from_source(src), "rb") as f:
            head = f.read(16)
    except (OSError, ValueError):
        return False
    if len(head) < 16 or head[:4] != MAGIC:
        return False
    if int.from_bytes(head[4:8], "little") & 1:  # hash-based: the import system checks it itself
        return True
    return (int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF)


def compile_one(src):
    try:
        py_compile.compile(src, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        return True
    except (py_compile.PyCompileError, OSError, ValueError, RecursionError):
        return False


def compiles(src):
    try:
        with open(src, "rb") as f:
            compile(f.read(), src, "exec", dont_inherit=True)
        return True
    except (SyntaxError, OSError, ValueError, RecursionError):
        return False


def sources(dirs):
    seen = set()
    for top in dirs:
        real = os.path.realpath(top)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        for root, subdirs, files in os.walk(real):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.join(root, name)


def main(argv):
    check = "--check" in argv
    dirs = [a for a in argv if a != "--check"]
    files = list(sources(dirs))
    stale = [f for f in files if not up_to_date(f)]
    compiled = 0
    if stale:
        # fork: this code may run from `python -c`, whose functions other start methods cannot pickle.
        with multiprocessing.get_context("fork").Pool(max(os.cpu_count() or 1, 1)) as pool:
            compiled = sum(pool.imap_unordered(compiles if check else compile_one, stale, chunksize=64))
    # "failed": sources that do not compile; they stay out of date and are not counted as a change.
    print(json.dumps({"files": len(files), "out_of_date": len(stale), "compiled": compiled,
                      "failed": len(stale) - compiled, "check": check}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
