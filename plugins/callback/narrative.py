# Copyright (c) 2026 specdec.eagle3 contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: narrative
type: stdout
short_description: One line per play, change, message, refusal and progress poll
description:
  - The screen output the collection's C(ansible.cfg) selects. Each play prints its name. A task prints only
    when it changed something (C(changed - <task>)), failed (its message, one line per argument error) or is a
    C(debug) message; a host that cannot be reached is one C(UNREACHABLE) line. Tasks that were ok or skipped
    print nothing, except a skipped C(include_role), which prints one C(skipped - <task>) line, so a role that does
    not apply is one line.
  - A task polled with C(until) prints the C(progress) field of its JSON C(stdout) when a poll brings a new
    one; an unchanged line is repeated at most once a minute, as a sign the run is alive.
  - Every line it prints from a result (messages, progress, failure lines and the output tails of a failed
    command, task names, item labels) shows control and invisible characters as their escapes (C(\x1b),
    C(\u202e)), so text from a managed host cannot clear the screen, move the cursor, set the terminal's title or hide
    what it says.
  - With C(-v) or more the output is the default callback's.
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
author: specdec developers (!UNKNOWN)
requirements:
  - set as stdout callback in configuration
"""

import json
import time
import unicodedata

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

ROLE_INCLUDES = {"include_role", "import_role"}
REPEAT_S = 60.0
# Unicode categories shown as escapes: controls (C0, DEL, C1 - ESC, so every terminal escape sequence, and CSI/OSC),
# format characters (bidi overrides, zero-width), surrogates, line and paragraph separators.
INVISIBLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def visible(text):
    """TEXT with each control or invisible character written as its escape (\\x1b, \\u202e); plain text unchanged.
    The one rule for everything this callback prints: it is the last hop before the user's terminal."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in INVISIBLE else ch
                   for ch in str(text))


def _action(task):
    return (getattr(task, "action", "") or "").rsplit(".", 1)[-1]


def _name(task):
    try:
        return task.get_name(include_role_fqcn=False).strip()
    except TypeError:
        return task.get_name().strip()


def _progress(res):
    try:
        data = json.loads((res.get("stdout") or "").strip().splitlines()[-1])
    except (ValueError, IndexError, AttributeError):
        return None
    return data.get("progress") if isinstance(data, dict) else None


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "specdec.eagle3.narrative"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_progress = {}  # host label -> (last progress line printed, when)

    def _quiet(self):
        return self._display.verbosity < 1

    def _say(self, text, **kwargs):
        """Print one line, its control and invisible characters shown as escapes (visible)."""
        self._display.display(visible(text), **kwargs)

    def _show_progress(self, result, progress):
        """Print a progress line when it changed, or when the same line was last printed a minute ago."""
        host = self._host(result)
        now = time.monotonic()
        seen = self._last_progress.get(host)
        if seen and seen[0] == progress and now - seen[1] < REPEAT_S:
            return
        self._last_progress[host] = (progress, now)
        self._say(f"  {host}{progress}")

    @staticmethod
    def _parts(result):
        task = getattr(result, "task", None) or result._task
        res = getattr(result, "result", None)
        if res is None:
            res = result._result
        return task, res

    def _host(self, result):
        hosts = getattr(self._play, "hosts", None) if self._play else None
        name = self.host_label(result)
        return "" if hosts in ("localhost", ["localhost"]) or name == "localhost" else f"[{name}] "

    def v2_playbook_on_play_start(self, play):
        if not self._quiet():
            return super().v2_playbook_on_play_start(play)
        self._play = play
        self._say(f"== {play.get_name().strip()}", color=C.COLOR_HIGHLIGHT)

    def v2_playbook_on_task_start(self, task, is_conditional):
        if not self._quiet():
            return super().v2_playbook_on_task_start(task, is_conditional)
        return None

    def v2_playbook_on_handler_task_start(self, task):
        if not self._quiet():
            return super().v2_playbook_on_handler_task_start(task)
        return None

    def v2_playbook_on_include(self, included_file):
        if not self._quiet():
            super().v2_playbook_on_include(included_file)

    def v2_runner_on_start(self, host, task):
        if not self._quiet():
            super().v2_runner_on_start(host, task)

    def v2_runner_on_ok(self, result):
        if not self._quiet():
            return super().v2_runner_on_ok(result)
        task, res = self._parts(result)
        self._handle_warnings_and_exception(result)
        if _action(task) == "debug" and "msg" in res:
            msgs = res["msg"] if isinstance(res["msg"], list) else [res["msg"]]
            for m in msgs:
                for line in str(m).splitlines() or [""]:
                    self._say(f"  {self._host(result)}{line}")
            return None
        progress = _progress(res)
        if progress:
            self._show_progress(result, progress)
        if res.get("changed") and not (task.loop and "results" in res):
            self._say(f"changed - {self._host(result)}{_name(task)}", color=C.COLOR_CHANGED)
        return None

    def v2_runner_item_on_ok(self, result):
        if not self._quiet():
            return super().v2_runner_item_on_ok(result)
        task, res = self._parts(result)
        if res.get("changed"):
            label = self._get_item_label(res)
            self._say(f"changed - {self._host(result)}{_name(task)} ({label})", color=C.COLOR_CHANGED)
        return None

    def v2_runner_on_skipped(self, result):
        if not self._quiet():
            return super().v2_runner_on_skipped(result)
        task, _res = self._parts(result)
        if _action(task) in ROLE_INCLUDES:
            self._say(f"skipped - {self._host(result)}{_name(task)}", color=C.COLOR_SKIP)
        return None

    def v2_runner_item_on_skipped(self, result):
        if not self._quiet():
            super().v2_runner_item_on_skipped(result)

    def v2_runner_on_async_poll(self, result):
        # A long task started with async/poll (the evaluate stage) reports its own result when it ends.
        if not self._quiet():
            super().v2_runner_on_async_poll(result)

    def v2_runner_on_async_ok(self, result):
        # The task's own result line follows; "ASYNC OK ... jid=..." says nothing to a reader.
        if not self._quiet():
            super().v2_runner_on_async_ok(result)

    def v2_runner_retry(self, result):
        if not self._quiet():
            return super().v2_runner_retry(result)
        task, res = self._parts(result)
        progress = _progress(res)
        if progress:
            self._show_progress(result, progress)
        else:
            left = res.get("retries", 0) - res.get("attempts", 0)
            self._say(f"  {self._host(result)}{_name(task)}: retrying ({left} left)", color=C.COLOR_DEBUG)
        return None

    def _failure_lines(self, res):
        if res.get("argument_errors"):
            return [str(e) for e in res["argument_errors"]]
        items = [str(r["msg"]) for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed") and r.get("msg")]
        lines = items or ([str(res["msg"])] if res.get("msg") else [])
        for key in ("stderr", "stdout", "module_stderr"):
            if res.get(key) and (not lines or res.get("rc")):
                lines += str(res[key]).rstrip().splitlines()[-15:]
                break
        return lines or [json.dumps({k: v for k, v in res.items() if not k.startswith("_")}, default=str)[:2000]]

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not self._quiet():
            return super().v2_runner_on_failed(result, ignore_errors)
        task, res = self._parts(result)
        self._handle_warnings(res)
        res.pop("exception", None)  # its message is the failure line below; -v shows the full error
        if ignore_errors:
            return None
        self._say(f"FAILED - {self._host(result)}{_name(task)}:", color=C.COLOR_ERROR,
                  stderr=self.get_option("display_failed_stderr"))
        for line in self._failure_lines(res):
            for sub in line.splitlines() or [""]:
                self._say(f"  {sub}", color=C.COLOR_ERROR, stderr=self.get_option("display_failed_stderr"))
        return None

    def v2_runner_on_unreachable(self, result):
        if not self._quiet():
            return super().v2_runner_on_unreachable(result)
        task, res = self._parts(result)
        reason = " ".join(str(res.get("msg") or "no answer").split())
        self._say(f"UNREACHABLE - {self.host_label(result)}: {reason} ({_name(task)}); check ansible_host, ansible_user "
                  "and SSH access to the host in the inventory", color=C.COLOR_UNREACHABLE,
                  stderr=self.get_option("display_failed_stderr"))
        return None

    def v2_runner_item_on_failed(self, result):
        if not self._quiet():
            super().v2_runner_item_on_failed(result)
