"""Each role default has one home, and its documentation says the same.

- Every role's `defaults/main.yml` equals the defaults its `meta/argument_specs.yml` declares, in every entry
  point: the same names, the same values (a default of null in `defaults/main.yml` is an option the spec gives
  no default). The specs are what `scripts/gen-role-docs` renders, so docs/roles.md and the role READMEs tell the defaults the roles use.
- No variable is defaulted by two roles: a value more than one role reads is the specdec role's
  (`roles/specdec`, which those roles depend on), never a copy per role.
- No role carries a fallback of its own for a shared value (`specdec_* | default(...)`).
"""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
SHARED_FALLBACK = re.compile(r"\bspecdec_[a-z0-9_]+\s*\|\s*default\s*\(")


def role_defaults(role):
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def spec_differences(role):
    defaults = role_defaults(role)
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    found = []
    for entry, spec in specs.items():
        for name, option in (spec.get("options") or {}).items():
            where = f"roles/{role.name}: {name} (entry point {entry})"
            if "default" in option:
                if name not in defaults:
                    found.append(f"{where}: the spec's default is {option['default']!r}, defaults/main.yml has none")
                elif defaults[name] != option["default"]:
                    found.append(f"{where}: the spec's default is {option['default']!r}, "
                                 f"defaults/main.yml says {defaults[name]!r}")
            elif defaults.get(name) is not None:
                found.append(f"{where}: defaults/main.yml says {defaults[name]!r}, the spec gives no default")
    declared = {name for spec in specs.values() for name in (spec.get("options") or {})}
    found += [f"roles/{role.name}: {name} is in defaults/main.yml but in no entry point of meta/argument_specs.yml"
              for name in defaults if name not in declared]
    return found


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_the_role_defaults_equal_the_argument_spec_defaults(role):
    assert spec_differences(role) == []


def test_no_variable_is_defaulted_by_two_roles():
    homes = {}
    for role in ROLES:
        for name in role_defaults(role):
            homes.setdefault(name, []).append(role.name)
    assert {name: roles for name, roles in homes.items() if len(roles) > 1} == {}


def test_no_role_keeps_a_fallback_for_a_shared_value():
    found = []
    for role in ROLES:
        for path in sorted(role.rglob("*")):
            if "files" in path.relative_to(role).parts or path.suffix not in (".yml", ".j2"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if SHARED_FALLBACK.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    for path in sorted((ROOT / "playbooks").rglob("*.yml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SHARED_FALLBACK.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
