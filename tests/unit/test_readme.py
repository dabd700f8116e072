"""The README's role-variable tables and every roles/<role>/README.md equal the roles' argument specs."""

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_readme_role_variables_match_argument_specs():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_role_docs.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_role_has_a_readme_for_galaxy():
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    missing = [role for role in roles if not (ROOT / "roles" / role / "README.md").is_file()]
    assert not missing, f"roles without README.md (Galaxy's importer refuses them): {missing}"


def test_every_role_has_argument_specs_with_described_options():
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    assert roles
    for role in roles:
        spec_file = ROOT / "roles" / role / "meta" / "argument_specs.yml"
        assert spec_file.is_file(), f"{role}: no meta/argument_specs.yml"
        main = yaml.safe_load(spec_file.read_text())["argument_specs"]["main"]
        for name, opt in (main.get("options") or {}).items():
            assert name.startswith((role + "_", "specdec_")), f"{role}: {name} lacks the role prefix"
            assert opt.get("description"), f"{role}: {name} has no description"
            assert "type" in opt, f"{role}: {name} has no type"


def test_readme_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in text.split("```sh\n")[1:3]]
    assert blocks[0] == "./scripts/bootstrap && .venv/bin/ansible-playbook site.yml"
    assert blocks[1] == "./scripts/test-all"
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec scripts/test-all")
