"""Lifecycle of a local inference server (vLLM's OpenAI server, or any HTTP server) for one measurement.

    with VllmServer(argv, port=8321, log_path=run_dir / "logs" / "serve.log") as srv:
        urllib.request.urlopen(srv.url("/v1/models"))

`start` checks that the port is free, starts ARGV in its own process group with its output in LOG_PATH, and
waits until GET READY_PATH answers 200 while watching the process. Every failure is one ServeError line
(port busy; the server exited while starting, with its exit status and log path; not ready in time). `stop`
- called on leaving the block, on any exception, at interpreter exit and on SIGTERM/SIGINT while the block
is active - ends the whole process group (SIGTERM, then SIGKILL after `stop_timeout_s`), so no worker the
server spawned is left behind. Only the standard library is used: the module runs in any venv.
"""

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from specdec_pipeline.errors import PipelineError


class ServeError(PipelineError):
    """The server could not be started or did not become ready; the message is one line."""


def port_in_use(host, port):
    """True when something listens on HOST:PORT (or the port cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host="127.0.0.1"):
    """A port the kernel reports free now (for tests and for callers without a fixed port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class VllmServer:
    """Context manager around one server process group; see the module docstring."""

    def __init__(self, argv, *, port, log_path, host="127.0.0.1", env=None, ready_timeout_s=600.0,
                 ready_path="/health", name="vLLM server", poll_s=0.5, stop_timeout_s=30.0):
        self.argv = [str(a) for a in argv]
        self.host = host
        self.port = int(port)
        self.env = env
        self.log_path = Path(log_path)
        self.ready_timeout_s = float(ready_timeout_s)
        self.ready_path = ready_path if ready_path.startswith("/") else "/" + ready_path
        self.name = name
        self.poll_s = poll_s
        self.stop_timeout_s = float(stop_timeout_s)
        self.proc = None
        self.startup_s = None
        self._old_handlers = {}

    # -- public API -----------------------------------------------------------------------------------
    def url(self, path=""):
        return f"http://{self.host}:{self.port}{path}"

    def start(self):
        if port_in_use(self.host, self.port):
            raise ServeError(f"{self.name}: port {self.host}:{self.port} is already in use; stop whatever "
                             "listens there or choose another port.")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (self.env or {}).items()})
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=env, start_new_session=True)
            except OSError as exc:
                raise ServeError(f"{self.name}: cannot start {self.argv[0]} ({exc.strerror}); "
                                 "check the venv path.") from None
        atexit.register(self.stop)
        self._install_signal_handlers()
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - started, 1)
        return self

    def stop(self):
        """End the whole process group; safe to call more than once."""
        proc, self.proc = self.proc, None
        self._restore_signal_handlers()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        for sig, wait in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.2)
                if proc.poll() is not None and not _group_alive(pgid):
                    return
            # still there: escalate
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    # -- internals ------------------------------------------------------------------------------------
    def _wait_ready(self, started):
        deadline = started + self.ready_timeout_s
        url = self.url(self.ready_path)
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServeError(f"{self.name} exited with status {rc} while starting; "
                                 f"its log is {self.log_path} (see the end of it).")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http on 127.0.0.1
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise ServeError(f"{self.name} was not ready at {url} within {self.ready_timeout_s:g} s "
                                 f"(stopped it); its log is {self.log_path}. Raise the readiness timeout "
                                 "if the model is large.")
            time.sleep(self.poll_s)

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, _frame):
            self.stop()
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._old_handlers = {}
