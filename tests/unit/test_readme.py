"""The README and docs/: a README a newcomer reads in minutes, its two commands where CI and tests/fresh/run take them,
links that lead somewhere, and the generated parts (role tables, compatibility table) where their scripts write them."""

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMAND_1 = "./scripts/bootstrap && .venv/bin/ansible-playbook site.yml"
COMMAND_2 = "./scripts/test-all"
MAX_README_LINES = 260


def _docs():
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def _code_blocks(text):
    """(info string, content) of every fenced code block, in order."""
    blocks, fence, info, body = [], None, "", []
    for line in text.splitlines():
        match = re.match(r"^(\s*)(```+|~~~+)(.*)$", line)
        if fence is None and match:
            fence, info, body = match.group(2), match.group(3).strip(), []
        elif fence is not None and match and match.group(2).startswith(fence) and not match.group(3).strip():
            blocks.append((info, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
    return blocks


def _prose(text):
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    out, fence = [], None
    for line in text.splitlines():
        match = re.match(r"^\s*(```+|~~~+)", line)
        if match and fence is None:
            fence = match.group(1)
            continue
        if match and fence is not None and match.group(1).startswith(fence):
            fence = None
            continue
        if fence is None:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def _heading_anchors(path):
    """GitHub's heading anchors of a Markdown file: the heading's text (inline code included) in lower case,
    punctuation dropped, spaces as hyphens, a repeated heading with -1, -2, ...; headings in code blocks do not count."""
    seen, anchors, fence = {}, set(), None
    for line in path.read_text().splitlines():
        fm = re.match(r"^\s*(```+|~~~+)", line)
        if fm:
            fence = None if fence is not None and fm.group(1).startswith(fence) else (fence or fm.group(1))
            continue
        if fence is not None:
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_readme_is_short_enough_to_read_in_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, more than {MAX_README_LINES}: move evidence, figures and details to docs/")


def test_readme_starts_with_the_two_commands():
    blocks = _code_blocks(README.read_text())
    assert blocks[0] == ("sh", COMMAND_1), f"README's first code block must be command 1 exactly: {blocks[:1]}"
    assert blocks[1] == ("sh", COMMAND_2), f"README's second code block must be command 2 exactly: {blocks[1:2]}"
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec scripts/test-all")


def test_the_scripts_that_run_command_1_take_it_from_the_readme():
    """tests/fresh/run and scripts/test-all (its `main` check) run what their `cmd=$(sed ... README.md)` extracts:
    that must be command 1."""
    for script in ("tests/fresh/run", "scripts/test-all"):
        found = re.findall(r"cmd=\$\((sed [^\n]*?README\.md)\)", (ROOT / script).read_text())
        assert found, f"{script}: no cmd=$(sed ... README.md) line"
        for expr in found:
            proc = subprocess.run(["bash", "-c", f'cmd=$({expr})\nprintf %s "$cmd"'], cwd=ROOT, capture_output=True,
                                  text=True, check=True)
            assert proc.stdout == COMMAND_1, f"{script} extracts {proc.stdout!r} from README.md"


def test_every_relative_link_of_the_readme_and_docs_leads_to_a_file_and_heading():
    broken = []
    for doc in _docs():
        for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(doc.read_text())):
            target = target.strip("<>")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: - not a file of this repository
            path_part, _sep, anchor = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where} names {path_part}, which does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in _heading_anchors(dest):
                broken.append(f"{where}: {dest.relative_to(ROOT)} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_files_the_readme_commands_name_exist():
    """A playbook or inventory named in a command of the README exists (the copy the quick start makes aside)."""
    named = set()
    for _info, body in _code_blocks(README.read_text()):
        for line in body.splitlines():
            command = line.split("#", 1)[0]
            named.update(re.findall(r"(?:playbooks/[\w/.-]+\.yml|site\.yml|inventory/[\w-]+|scripts/[\w-]+)", command))
    assert "site.yml" in named and "scripts/bootstrap" in named
    made = {"inventory/mykimi"}  # made by the quick start's own `cp -r`
    missing = sorted(n for n in named - made if not (ROOT / n).exists())
    assert not missing, f"README commands name files that do not exist: {missing}"


def test_the_link_check_sees_a_broken_link(tmp_path):
    """The checker itself: a heading's anchor is found, a missing heading is not."""
    doc = tmp_path / "a.md"
    doc.write_text("# Kimi-K2.5 in miniature (`inventory/local-kimi`)\n\n## Shared values: one owner\n")
    assert _heading_anchors(doc) == {"kimi-k25-in-miniature-inventorylocal-kimi", "shared-values-one-owner"}
    assert _prose("a `[x](y)` b\n```\n[z](w)\n```\n[k](l)") == "a  b\n[k](l)"


def test_role_tables_in_docs_match_argument_specs():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_role_docs.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_compatibility_table_has_its_home():
    """scripts/compat-table finds its section in docs/compatibility.md (2 would mean it found no markers)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "compat-table"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    text = (ROOT / "docs" / "compatibility.md").read_text()
    assert text.count("<!-- BEGIN COMPAT TABLE -->") == 1 and text.count("<!-- END COMPAT TABLE -->") == 1


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
