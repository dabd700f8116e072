"""Exit 0 when every `name==version` line of the requirements text (argv[1]) is installed at that version.

Reads installed distribution metadata only (nothing is imported); prints what is missing or different.
"""
import importlib.metadata as md
import re
import sys

wrong = []
for line in sys.argv[1].splitlines():
    line = line.split("#", 1)[0].strip()
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
