"""The collection's stdout callback (specdec.eagle3.narrative) tells a run as one narrative.

A real ansible-playbook run on localhost with a small playbook: a role skipped as a whole is one line, ok and
skipped tasks print nothing, a change is one line, a poll prints a progress line when it changes (an unchanged one at most once a minute), and an argument
spec failure prints the failing argument, not the whole spec.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PLAYBOOK = textwrap.dedent("""\
    - name: Narrative test play
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Install the NVIDIA driver
          ansible.builtin.include_role:
            name: specdec.eagle3.nvidia_driver
          when: false
        - name: Read something quietly
          ansible.builtin.command: "true"
          changed_when: false
        - name: A task that does not apply
          ansible.builtin.command: "true"
          when: false
        - name: Write a file
          ansible.builtin.copy:
            content: "x"
            dest: "{{ out }}/f"
            mode: "0644"
        - name: Tell the user something
          ansible.builtin.debug:
            msg: hello reader
        - name: Poll until three rounds are done
          ansible.builtin.shell: |
            n=$(cat {{ out }}/n 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {{ out }}/n
            echo "{\\"progress\\": \\"round $n of 3\\", \\"finished\\": $([ $n -ge 3 ] && echo true || echo false)}"
          register: poll
          changed_when: false
          until: (poll.stdout | from_json).finished
          retries: 5
          delay: 0
        - name: Poll a step that does not move for three rounds
          ansible.builtin.shell: |
            n=$(cat {{ out }}/m 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {{ out }}/m
            if [ $n -ge 4 ]; then echo '{"progress": "step: done", "finished": true}';
            else echo '{"progress": "step: 5/9", "finished": false}'; fi
          register: still
          changed_when: false
          until: (still.stdout | from_json).finished
          retries: 5
          delay: 0
        - name: Run something in the background and wait for it
          ansible.builtin.command: "true"
          async: 30
          poll: 1
          changed_when: false
        - name: Validate a bad list
          ansible.builtin.include_role:
            name: specdec.eagle3.eagle3_pipeline
            tasks_from: main
          vars:
            specdec_venv_path: /nonexistent/venv
            specdec_work_dir: /nonexistent/work
            specdec_gpu_count: 0
            specdec_prefix: /nonexistent
            specdec_profile: test
            eagle3_pipeline_layer_ids: "[x]"
    """)


def test_the_narrative(tmp_path):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="specdec.eagle3.narrative")
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
                           "-e", f"out={tmp_path}", "-e", f"ansible_python_interpreter={sys.executable}",
                           str(tmp_path / "play.yml")], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    body = lines[:lines.index(next(ln for ln in lines if ln.startswith("PLAY RECAP")))]
    assert body[:6] == [
        "== Narrative test play",
        "skipped - Install the NVIDIA driver",
        "changed - Write a file",
        "  hello reader",
        "  round 1 of 3",
        "  round 2 of 3",
    ], proc.stdout
    assert body[6] == "  round 3 of 3"
    # An unchanged progress line is not repeated within a minute.
    assert body[7:9] == ["  step: 5/9", "  step: done"], body
    # The argument spec failure: the task, then one line naming the argument; no spec dump.
    assert body[9].startswith("FAILED - ") and "Validating arguments against arg spec" in body[9], body
    assert len(body) == 11, "\n".join(body)
    assert "eagle3_pipeline_layer_ids" in body[10]
    assert "argument_spec" not in proc.stdout and "short_description" not in proc.stdout
