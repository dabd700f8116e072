"""The checkout commits no link to a directory (ansible-test sanity refuses one), and the collections/ link that
scripts/bootstrap makes for the checkout's own playbooks lies where ansible.cfg looks and where git ignores it."""

import configparser
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = "collections/ansible_collections/specdec/eagle3"


def _git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def test_no_committed_link_to_a_directory():
    links = [line.split("\t", 1)[1] for line in _git("ls-files", "-s", "-z").split("\0")
             if line.startswith("120000 ")]
    to_dirs = [p for p in links if (ROOT / p).is_dir()]
    assert not to_dirs, f"committed links to directories (ansible-test sanity refuses them): {to_dirs}"


def test_the_collections_link_is_ignored_and_named_by_ansible_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert os.path.normpath(cfg["defaults"]["collections_path"]) == LINK.split("/", 1)[0]
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", LINK], check=False)
    assert ignored.returncode == 0, f"{LINK} is not git-ignored"
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    assert f'link="$here/{LINK}"' in bootstrap and "ln -sfn ../../.. " in bootstrap
