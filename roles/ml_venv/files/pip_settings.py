"""Print, as JSON, the host's pip settings that uv should honour (uv does not read pip's configuration).

Reads `pip config list` (pip's files and PIP_* variables, highest precedence wins) and turns find-links,
index-url, extra-index-url, no-index and constraint into uv arguments; a local path that does not exist is
left out (pip ignores it too) and named in "dropped".  "indexes" lists the indexes pip itself would consult (its
index-url, PyPI unless set, then each extra index; none with no-index): the ml_venv role resolves as pip does, the
best version across them, where pip's settings name more than one.  pip's `cert` is reported so uv can trust it as
well.
"""
import json
import os
import subprocess
import sys

RANK = {"global": 0, "user": 1, "site": 2, "env": 3, ":env:": 4}
PYPI = "https://pypi.org/simple"
FLAGS = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "constraint": "--constraint"}


def local_path(value):
    if value.startswith("file://"):
        return value[len("file://"):]
    return None if "://" in value else value


def main():
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    best = {}
    for line in out.splitlines():
        scope, dummy, rest = line.partition(".")
        key, dummy, value = rest.partition("=")
        key = key.strip().split(".")[-1]
        rank = RANK.get(scope, 0)
        if key and rank >= best.get(key, (-1, ""))[0]:
            best[key] = (rank, value.strip().strip("'\""))
    args, dropped, indexes = [], [], []
    for key, flag in FLAGS.items():
        for value in best.get(key, (0, ""))[1].split():
            path = local_path(value)
            if path is not None and not os.path.exists(path):
                dropped.append(value)
                continue
            args += [flag, value]
            if key in ("index-url", "extra-index-url"):
                indexes.append(value)
    if "index-url" not in best:
        indexes.insert(0, PYPI)
    if best.get("no-index", (0, ""))[1].lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
        indexes = []
    cert = best.get("cert", (0, ""))[1]
    print(json.dumps({"args": args, "dropped": dropped, "indexes": indexes,
                      "cert": cert if cert and os.path.isfile(cert) else ""}))


main()
