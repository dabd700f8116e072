"""The PATH a managed vLLM server starts with (specdec_pipeline/serve.py programs_path): its venv's programs first, as
in an activated venv, then those of an environment whose site-packages the venv inherits
(specdec_venv_inherit_site_packages). On the GPU machine's image vLLM 0.26.0 failed to start without it: FlashInfer
compiles its sampler at start with `ninja`, which that image has only in /opt/torch/.venv/bin."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "eagle3_pipeline" / "files"))

from specdec_pipeline.serve import ServeError, VllmServer, free_port, programs_path  # noqa: E402

WRITE_PATH = "import os, sys; open(sys.argv[1], 'w').write(os.environ['PATH']); raise SystemExit(3)"


def _venv(tmp_path):
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.symlink_to(sys.executable)
    return python


def test_the_interpreters_directory_and_an_inherited_environments_bin_lead_the_path(tmp_path):
    python = _venv(tmp_path)
    image = tmp_path / "image"
    (image / "bin").mkdir(parents=True)
    site = image / "lib" / "python3.12" / "site-packages"
    no_bin = tmp_path / "nobin" / "lib" / "python3.12" / "site-packages"
    path = programs_path([str(python), "-m", "vllm"], f"/usr/bin:{image / 'bin'}:/bin",
                         sys_path=[str(tmp_path / "venv" / "lib" / "python3.12" / "site-packages"), str(site),
                                   str(no_bin), "/usr/lib/python3.12"])
    # The venv's own site-packages gives venv/bin (already first); an environment without bin/ adds nothing;
    # a directory already on PATH moves to the front instead of appearing twice.
    assert path.split(os.pathsep) == [str(tmp_path / "venv" / "bin"), str(image / "bin"), "/usr/bin", "/bin"]


def test_a_command_without_a_directory_keeps_the_path_as_it_was():
    assert programs_path(["python3", "-c", "pass"], "/usr/bin:/bin", sys_path=[]) == "/usr/bin:/bin"


def test_the_server_process_starts_with_its_venvs_programs_first(tmp_path):
    python = _venv(tmp_path)
    seen = tmp_path / "path.txt"
    srv = VllmServer([str(python), "-c", WRITE_PATH, str(seen)], port=free_port(), log_path=tmp_path / "serve.log",
                     name="test server", poll_s=0.1, stop_timeout_s=5, ready_timeout_s=30, env={"PATH": "/usr/bin:/bin"})
    try:
        srv.start()
    except ServeError as err:
        assert "while starting" in str(err), err
    else:
        srv.stop()
        raise AssertionError("a server that exited was reported ready")
    entries = seen.read_text().split(os.pathsep)
    assert entries[0] == str(tmp_path / "venv" / "bin") and entries[-2:] == ["/usr/bin", "/bin"], entries
