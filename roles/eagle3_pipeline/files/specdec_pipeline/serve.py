"""A managed local server process (vLLM's OpenAI-compatible server) - minimal version.

    with VllmServer(argv, port=port, log_path=path, env={...}, ready_timeout_s=600) as srv:
        ... requests to srv.url("/v1/completions") ...

On entry: refuse a busy port, start ARGV in a new process group (output appended to LOG_PATH) and wait for
GET /health to answer 200 while watching the process. On exit (also on an exception): end the whole process
group, SIGTERM then SIGKILL. Standard library only.
"""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from specdec_pipeline.errors import PipelineError


class ServeError(PipelineError):
    """The server did not start or did not become ready (one-line message)."""


def _port_busy(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class VllmServer:
    def __init__(self, argv, *, port, log_path, host="127.0.0.1", env=None, ready_timeout_s=600.0):
        self.argv = [str(a) for a in argv]
        self.host, self.port = host, int(port)
        self.log_path = Path(log_path)
        self.env = env or {}
        self.ready_timeout_s = float(ready_timeout_s)
        self.proc = None

    def url(self, path=""):
        return f"http://{self.host}:{self.port}{path}"

    def __enter__(self):
        if _port_busy(self.host, self.port):
            raise ServeError(f"port {self.host}:{self.port} is in use; stop what listens there or pick another port.")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **{k: str(v) for k, v in self.env.items()})
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def _wait_ready(self):
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ServeError(f"the server exited with status {self.proc.returncode} while starting; "
                                 f"see {self.log_path}.")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as resp:  # noqa: S310 - local http
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServeError(f"the server was not ready within {self.ready_timeout_s:g} s; see {self.log_path}.")
            time.sleep(0.5)

    def _stop(self):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
            try:  # the leader is gone; wait for the rest of its group
                end = time.monotonic() + grace
                while time.monotonic() < end:
                    os.killpg(proc.pid, 0)
                    time.sleep(0.2)
            except ProcessLookupError:
                break
