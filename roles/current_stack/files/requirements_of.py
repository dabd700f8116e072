"""Print the runtime requirements of installed distributions, one per line, minus the names given to --drop.

Usage: python requirements_of.py DIST [DIST ...] [--drop NAME ...]

The current track installs vLLM, speculators and hs-connectors with --no-deps and then their requirements
through this list, so packages that cannot run on a profile (e.g. torchvision without a matching CPU build) can
be left out while every other requirement is still honoured.  Markers are evaluated for this interpreter;
extras are not selected.  scripts/build-wheelhouse applies the same rule (requirement_lines) to the wheels'
metadata for another interpreter and platform, so a wheelhouse holds what this list will ask for.
"""

import importlib.metadata as md
import sys

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name


def requirement_lines(requires, drop, environment=None):
    """The requirement lines of `requires` ({distribution: [Requires-Dist text, ...]}), sorted.

    Requirements whose marker is false for `environment` (None: this interpreter) with no extra selected are
    left out, as are the names in `drop` and the distributions themselves; the rest lose their markers.
    """
    wanted = {canonicalize_name(d) for d in requires}
    dropped = {canonicalize_name(d) for d in drop}
    env = dict(environment or {}, extra="")
    lines = set()
    for texts in requires.values():
        for text in texts:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = canonicalize_name(req.name)
            if name in dropped or name in wanted:
                continue
            req.marker = None
            lines.add(str(req))
    return sorted(lines)


def main(argv):
    dists, drop, target = [], [], None
    for arg in argv:
        if arg == "--drop":
            target = drop
        elif target is drop:
            drop.append(arg)
        else:
            dists.append(arg)
    requires = {}
    for dist in dists:
        try:
            requires[dist] = md.requires(dist) or []
        except md.PackageNotFoundError:
            print(f"requirements_of: {dist} is not installed in {sys.prefix}", file=sys.stderr)
            return 2
    print("\n".join(requirement_lines(requires, drop)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
