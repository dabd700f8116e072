"""Exit 0 when every `name==version` requirement of the requirements text (argv[1]) is installed at that version.

A requirement may continue over several lines (a trailing backslash) and carry `--hash=` options, as in a
hash-checking requirements file; the hashes are pip's to check at install time, not here. Reads installed
distribution metadata only (nothing is imported); prints what is missing or different.
"""
import importlib.metadata as md
import re
import sys

wrong = []
for line in re.sub(r"\\\n", " ", sys.argv[1]).splitlines():
    line = re.sub(r"\s--hash[= ]\S+", "", " " + line.split("#", 1)[0]).strip()
    m = re.match(r"^([A-Za-z0-9._-]+)\s*==\s*([^\s;]+)$", line)
    if not line:
        continue
    if not m:
        wrong.append(f"{line} (not an exact pin: always installed)")
        continue
    try:
        have = md.version(m.group(1))
    except md.PackageNotFoundError:
        have = None
    if have != m.group(2):
        wrong.append(f"{m.group(1)} {have or 'missing'} (want {m.group(2)})")
print("; ".join(wrong) or "ok")
sys.exit(1 if wrong else 0)
