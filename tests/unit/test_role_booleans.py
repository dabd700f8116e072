"""Every boolean role variable acts as a boolean however it is passed.

`-e name=false` passes the text "false"; the argument spec validation accepts it but does not hand the converted
value back to the role, so each use of a `type: bool` variable in tasks, templates and vars must go through
`| bool`. This test reads every role's argument specs and every Jinja expression or `when:` condition that uses
such a variable.
"""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXPR = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)


def bool_options(role):
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return {name for entry in spec.values() for name, opt in (entry.get("options") or {}).items()
            if opt.get("type") == "bool"}


# The shared values (declared by the specdec role, which the roles depend on) are read by every role.
SHARED = ROOT / "roles" / "specdec"


def conditions(node):
    """Yield every `when`/`changed_when`/`failed_when`/`until`/`that` string and every string value."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("when", "changed_when", "failed_when", "until", "that"):
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, str):
                        yield "{{" + item + "}}"
            yield from conditions(value)
    elif isinstance(node, list):
        for item in node:
            yield from conditions(item)
    elif isinstance(node, str):
        yield node


def uses_without_bool(role, names):
    found = []
    files = [*role.glob("tasks/**/*.yml"), *role.glob("handlers/*.yml"), *role.glob("vars/**/*.yml"), *role.glob("templates/*")]
    for path in files:
        text = path.read_text()
        strings = conditions(yaml.safe_load(text)) if path.suffix == ".yml" else [text]
        for s in strings:
            for m in EXPR.finditer(s):
                expr = m.group(1) or m.group(2)
                for name in names:
                    for use in re.finditer(rf"\b{name}\b(?!\s*\|\s*bool)", expr):
                        found.append(f"{path.relative_to(role.parent)}: {name} in '{expr.strip()[:120]}'")
    return found


def test_every_boolean_role_variable_is_used_through_the_bool_filter():
    found = []
    for role in sorted((ROOT / "roles").iterdir()):
        found += uses_without_bool(role, bool_options(role) | bool_options(SHARED))
    assert found == []


def test_the_check_finds_a_bare_use(tmp_path):
    role = tmp_path / "r"
    (role / "tasks").mkdir(parents=True)
    (role / "tasks" / "main.yml").write_text(
        "- name: X\n  ansible.builtin.debug: {msg: \"{{ 'a' if r_other | bool else 'b' }}\"}\n  when: r_flag and r_other | bool\n")
    assert uses_without_bool(role, {"r_flag", "r_other"}) == ["r/tasks/main.yml: r_flag in 'r_flag and r_other | bool'"]
