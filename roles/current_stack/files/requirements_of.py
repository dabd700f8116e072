"""Print the runtime requirements of installed distributions, one per line, minus the names given to --drop.

Usage: python requirements_of.py DIST [DIST ...] [--drop NAME ...]

The current track installs vLLM, speculators and hs-connectors with --no-deps and then their requirements
through this list, so packages that cannot run on a profile (e.g. torchvision without a matching CPU build) can
be left out while every other requirement is still honoured.  Markers are evaluated for this interpreter;
extras are not selected.
"""

import importlib.metadata as md
import sys

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name


def main(argv):
    dists, drop, target = [], set(), None
    for arg in argv:
        if arg == "--drop":
            target = drop
        elif target is drop:
            drop.add(canonicalize_name(arg))
        else:
            dists.append(arg)
    wanted = {canonicalize_name(d) for d in dists}
    lines = set()
    for dist in dists:
        try:
            reqs = md.requires(dist) or []
        except md.PackageNotFoundError:
            print(f"requirements_of: {dist} is not installed in {sys.prefix}", file=sys.stderr)
            return 2
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(req.name)
            if name in drop or name in wanted:
                continue
            req.marker = None
            lines.add(str(req))
    print("\n".join(sorted(lines)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
