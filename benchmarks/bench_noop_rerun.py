"""Time a cold first run of `ansible-playbook site.yml` (default inventory) and the no-op re-run after it.

    .venv/bin/python benchmarks/bench_noop_rerun.py [--prefix DIR] [--keep]

The runs install into a fresh prefix (a temporary directory unless --prefix names an empty one), so the first
run really installs the venv, vLLM, speculators and runs the pipeline; uv's download cache is shared through
${SPECDEC_CACHE:-~/.cache/specdec-eagle3}/bench-uv so repeated benchmarks do not download again (the first
one does). Prints both times, the ratio (target: no-op <= 25 % of cold) and each run's recap line.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections"))
from ansible_collections.specdec.eagle3.plugins.module_utils.exit_status import exit_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run(extra):
    playbook = Path(sys.executable).with_name("ansible-playbook")
    cmd = [str(playbook), "site.yml", *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    recap = next((ln for ln in reversed(proc.stdout.splitlines()) if re.match(r"^\S+\s+:\s+ok=", ln)), "(no recap)")
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"ansible-playbook {exit_text(proc.returncode)}")
    return took, re.sub(r"\s+", " ", recap), len(proc.stdout.splitlines())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", help="empty directory used as specdec_prefix (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary prefix")
    args = parser.parse_args()
    prefix = Path(args.prefix or tempfile.mkdtemp(prefix="specdec-bench-"))
    if args.prefix and prefix.exists() and any(prefix.iterdir()):
        raise SystemExit(f"--prefix {prefix}: expected an empty directory (the first run must be cold)")
    cache = Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec-eagle3")) / "bench-uv"
    cache.mkdir(parents=True, exist_ok=True)
    extra = ["-e", f"specdec_prefix={prefix}", "-e", f"ml_venv_cache_dir={cache}"]
    try:
        cold, cold_recap, cold_lines = run(extra)
        noop, noop_recap, noop_lines = run(extra)
    finally:
        if not args.prefix and not args.keep:
            shutil.rmtree(prefix, ignore_errors=True)
    print(f"cold first run : {cold:7.1f} s  ({cold_lines} lines)  {cold_recap}")
    print(f"no-op re-run   : {noop:7.1f} s  ({noop_lines} lines)  {noop_recap}")
    print(f"ratio          : {noop / cold:7.1%}  (target <= 25 %)")


if __name__ == "__main__":
    main()
