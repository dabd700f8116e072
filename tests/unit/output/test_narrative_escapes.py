"""Terminal escapes in text from the managed host never reach the controller's terminal through the narrative callback.

A real ansible-playbook run on localhost: a progress file whose message the pipeline user controls, read by the real
progress_line as the roles poll it; a debug message; a failed command whose stderr tail the callback prints. Each
carries a screen clear (ESC [2J), a title change (OSC 0 ... BEL), an 8-bit CSI (U+009B) and a bidi override (U+202E).
What the callback prints shows them as escapes (\\x1b, \\x9b, \\u202e) around the unchanged plain text.
"""

import json
import os
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CODE = ROOT / "roles" / "eagle3_pipeline" / "files"
HOSTILE = "\x1b[2J\x1b]0;owned\x07 \x9b31m tick\u202etxt.exe"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07 \\x9b31m tick\\u202etxt.exe"

PLAYBOOK = textwrap.dedent("""\
    - name: Escapes test play
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Show the evaluation's progress until it ends
          ansible.builtin.command:
            argv: ["{{ python }}", -m, specdec_pipeline.progress_line, "{{ out }}/progress.json", "{{ out }}/job"]
          environment:
            PYTHONPATH: "{{ code }}"
          register: poll
          changed_when: false
          until: (poll.stdout | from_json).finished
          retries: 2
          delay: 0
        - name: Tell the user what the host said
          ansible.builtin.debug:
            msg: "{{ lookup('ansible.builtin.file', out ~ '/said') }}"
        - name: Run a command that fails with a hostile stderr
          ansible.builtin.command:
            argv: ["{{ python }}", -c, "import sys; sys.stderr.write(open(sys.argv[1]).read()); sys.exit(3)", "{{ out }}/said"]
    """)


def invisible(text):
    return sorted({f"U+{ord(ch):04X}" for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf")})


def test_host_text_is_printed_with_its_escapes_visible(tmp_path):
    (tmp_path / "progress.json").write_text(json.dumps({"step": "evaluate", "message": HOSTILE}))
    (tmp_path / "job").write_text(json.dumps({"finished": 1}))
    (tmp_path / "said").write_text(HOSTILE)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="specdec.eagle3.narrative")
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps({"out": str(tmp_path), "code": str(CODE), "python": sys.executable,
                                             "ansible_python_interpreter": sys.executable}),
                           str(tmp_path / "play.yml")], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    printed = proc.stdout + proc.stderr
    assert invisible(printed) == [], printed
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert f"  evaluate: {SHOWN}" in lines, proc.stdout  # the progress line, through progress_line's JSON
    assert f"  {SHOWN}" in lines, proc.stdout  # the debug message and the failed command's stderr tail
    assert lines.count(f"  {SHOWN}") == 2, proc.stdout
    assert any(ln.startswith("FAILED - Run a command that fails") for ln in lines), proc.stdout
