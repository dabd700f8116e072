"""Inventories state what differs from the defaults, and why - nothing else.

The rule: a key in an inventory's group_vars (or host_vars) whose value equals, as YAML, the default of the role
that owns it (the one `roles/*/defaults/main.yml` that defines it; the shared `specdec_*` values are
`roles/specdec`'s) is flagged, unless a comment on its line or in the comment lines directly above it (no blank
line between) contains the word "pinned", saying why the value is pinned there, e.g.

    # pinned: the sample states the GPU count the production host has, for whoever copies it.
    specdec_gpu_count: 8

Every shipped inventory is checked (inventory/*), the Kimi samples included. Either remove the key (the default
applies) or say why it is pinned.
"""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INVENTORIES = sorted(p for p in (ROOT / "inventory").iterdir() if p.is_dir())
KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:")
PINNED = re.compile(r"#.*\bpinned\b", re.I)


def defaults():
    owners = {}
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            owners[name] = (value, path.relative_to(ROOT))
    return owners


def pinned_comment(lines, index):
    """Whether line `index` or the comment block directly above it says "pinned"."""
    if PINNED.search(lines[index].split(":", 1)[1] if ":" in lines[index] else ""):
        return True
    above = index - 1
    while above >= 0 and lines[above].lstrip().startswith("#"):
        if PINNED.search(lines[above]):
            return True
        above -= 1
    return False


def restated_defaults(inventory):
    owners = defaults()
    found = []
    files = sorted([*inventory.glob("group_vars/**/*.yml"), *inventory.glob("host_vars/**/*.yml")])
    for path in files:
        text = path.read_text()
        values = yaml.safe_load(text) or {}
        lines = text.splitlines()
        for index, line in enumerate(lines):
            match = KEY.match(line)
            if not match or match.group(1) not in values or match.group(1) not in owners:
                continue
            name = match.group(1)
            default, home = owners[name]
            if values[name] == default and not pinned_comment(lines, index):
                found.append(f"{path.relative_to(inventory.parent)}:{index + 1}: {name} is {values[name]!r}, the default of "
                             f"{home}; remove the line, or say why it is pinned in a comment on it or directly "
                             f"above it containing 'pinned'")
    return found


@pytest.mark.parametrize("inventory", INVENTORIES, ids=[p.name for p in INVENTORIES])
def test_an_inventory_restates_no_default_without_saying_why(inventory):
    assert restated_defaults(inventory) == []


def test_the_rule_flags_a_restated_default_and_accepts_a_pinned_one(tmp_path):
    group = tmp_path / "group_vars" / "eagle3_hosts"
    group.mkdir(parents=True)
    (group / "profile.yml").write_text(
        "---\n"
        "specdec_track: patched\n"          # no default: never flagged
        "specdec_gpu_count: 8\n"            # the specdec role's default, no comment: flagged
        "specdec_prefix: /srv/specdec\n"    # differs from the default
        "# pinned: the production host's Python, stated for whoever copies the sample\n"
        "specdec_python_version: \"3.12\"\n"
        "specdec_evaluate: true  # pinned: the stage is the point of this profile\n"
        "# a comment that says nothing about pinning\n"
        "vllm_version: \"0.16.0\"\n")
    found = restated_defaults(tmp_path)
    assert [line.split(": ", 1)[0] for line in found] == [f"{tmp_path.name}/group_vars/eagle3_hosts/profile.yml:3",
                                                          f"{tmp_path.name}/group_vars/eagle3_hosts/profile.yml:9"]
    assert "specdec_gpu_count is 8, the default of roles/specdec/defaults/main.yml" in found[0]
    assert "vllm_version is '0.16.0', the default of roles/vllm/defaults/main.yml" in found[1]
