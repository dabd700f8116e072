"""The speculators role's requirement lists cover what each real speculators wheel imports, and nothing it never imports."""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tests.support.upstream import fetch  # noqa: E402

ROLE = ROOT / "roles" / "speculators"
BY_VERSION = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["speculators_runtime_requirements_by_version"]
SPEC = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
# Import name -> distributions that provide it. vllm comes from the vllm role; wandb is optional (guarded by try/except).
PROVIDERS = {"huggingface_hub": {"huggingface-hub"}, "typer": {"typer", "typer-slim"}, "pydantic_core": {"pydantic"},
             "typing_extensions": {"typing-extensions"}}
NOT_OURS = {"speculators", "vllm", "wandb"}


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def _third_party_imports(wheel: Path) -> set[str]:
    found = set()
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if not name.endswith(".py"):
                continue
            for node in ast.walk(ast.parse(zf.read(name))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__"}


def test_supported_versions_are_the_choices_of_the_role():
    assert sorted(BY_VERSION) == sorted(SPEC["speculators_version"]["choices"])
    assert SPEC["speculators_version"]["default"] in BY_VERSION


@pytest.mark.parametrize("version", sorted(BY_VERSION))
def test_every_import_of_the_wheel_is_covered(version):
    wheel = fetch("speculators", version, "wheel")
    dists = {_dist(r) for r in BY_VERSION[version]}
    missing = {mod for mod in _third_party_imports(wheel) - NOT_OURS
               if not (PROVIDERS.get(mod, {mod.replace("_", "-")}) & dists)}
    assert not missing, f"speculators {version} imports {sorted(missing)} but the role does not install them"


@pytest.mark.parametrize("version", sorted(BY_VERSION))
def test_nothing_unimported_or_vllm_is_installed(version):
    wheel = fetch("speculators", version, "wheel")
    imports = _third_party_imports(wheel)
    for requirement in BY_VERSION[version]:
        dist = _dist(requirement)
        providers = {mod for mod, names in PROVIDERS.items() if dist in names} | {dist.replace("-", "_")}
        assert providers & imports, f"{requirement} is in the list for {version} but the wheel never imports it"
    assert not {"deepspeed", "vllm", "accelerate"} & {_dist(r) for r in BY_VERSION[version]}


def test_transformers_and_datasets_stay_below_5():
    for version, requirements in BY_VERSION.items():
        by_dist = {_dist(r): r for r in requirements}
        assert re.search(r"(<5\b|<=4\.)", by_dist["transformers"]), version
        assert re.search(r"(<5\b|<=4\.)", by_dist["datasets"]), version
