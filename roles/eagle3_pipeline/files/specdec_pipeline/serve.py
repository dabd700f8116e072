"""The local vLLM server, one home for everything about it: its arguments, API key, lifecycle, requests, free port
and /metrics. Used by the current track's extraction and by the evaluate stage.

    port = free_port()
    argv = vllm_argv(sys.executable, model_dir, port) + ["--dtype", "bfloat16"]
    with VllmServer(argv, port=port, log_path=run_dir / "logs" / "serve.log") as srv:
        answer = srv.post("/v1/completions", {"model": SERVED_NAME, "prompt": [1, 2], "max_tokens": 1}, 60)
        counters = srv.metrics()

`vllm_argv` is the start of every server command line (vLLM's OpenAI server module - the same code as `vllm serve`,
and it also runs from vLLM's CPU build, whose distribution name `vllm serve` cannot find - on 127.0.0.1, the
model served under SERVED_NAME, behind serve_guard.KeyGuard: the key on every route but /health, no client-chosen
request id); the caller appends its own options. `post_json` / `get_text` are the requests
(one HttpError / NoAnswer each, which the caller words for its stage).

`start` checks that the port is free, starts ARGV in its own session (process group) with its output in LOG_PATH
and a fresh random API key in its environment (VLLM_API_KEY: never on a command line, never in a file), and waits
until the server is ready and provably ours: the socket listening on the port is held by a process of the
server's session (found in /proc/net/tcp and /proc/<pid>/fd), GET READY_PATH answers 200, GET AUTH_PATH
answers 200 with the key and 401 without it, and GUARD_PROBE_PATH - outside the /v1 paths vLLM's own key check
covers - answers 401 without it (the guard is in place). A port taken by anything else is refused at once (the port is picked
free, but another local user may bind it before the server does). `check_ours` repeats the socket check and that
the server still runs; it is called after a measurement and on leaving the block without an error. Every failure
is one ServeError line. `stop` - called on leaving the block, on any exception, at interpreter exit and on
SIGTERM/SIGINT while the block is active - ends the whole process group (SIGTERM, then SIGKILL after
`stop_timeout_s`), so no worker the server spawned is left behind. Only the standard library is used: the module
runs in any venv. Linux only (/proc).
"""

import atexit
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from specdec_pipeline.errors import PipelineError, exit_text


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
    """A port the kernel reports free now. Another process may bind it before the server does: VllmServer's
    socket check refuses the port then."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "specdec-target"  # the name the model is served under (requests name it)
HOST = "127.0.0.1"
CODE_DIR = str(Path(__file__).resolve().parent.parent)  # the folder holding specdec_pipeline
SERVER_GUARD = "specdec_pipeline.serve_guard.KeyGuard"  # vLLM's --middleware: the key on every route (serve_guard.py)
# A route vLLM serves without its own key check (SageMaker's, which runs a completion): GET only probes the guard.
GUARD_PROBE_PATH = "/invocations"


def programs_path(argv, path, sys_path=None):
    """PATH for a server started as ARGV, as in its activated venv: the directory of the interpreter ARGV[0], then
    the bin directory of every site-packages this interpreter sees (PREFIX/lib/pythonX.Y/site-packages ->
    PREFIX/bin, where it exists: an inherited environment's programs), then PATH; no directory twice. vLLM compiles
    FlashInfer's sampler at start with `ninja`, which an image with a preinstalled CUDA torch has only there."""
    first = []
    if os.sep in argv[0]:
        first.append(os.path.dirname(os.path.abspath(argv[0])))
    for entry in sys.path if sys_path is None else sys_path:
        parts = os.path.abspath(entry).split(os.sep)
        if len(parts) > 3 and parts[-1] == "site-packages" and parts[-3] == "lib":
            first.append(os.sep.join(parts[:-3] + ["bin"]))
    seen, out = set(), []
    for d in first + [d for d in path.split(os.pathsep) if d]:
        if d not in seen and (d not in first or os.path.isdir(d)):
            seen.add(d)
            out.append(d)
    return os.pathsep.join(out)


def vllm_argv(python, model, port, *, served_name=SERVED_NAME, wrapper=()):
    """The start of a vLLM server's command line: WRAPPER, PYTHON -m the OpenAI server, the model, its served name,
    host 127.0.0.1, PORT and the guard (SERVER_GUARD; VllmServer puts this package on the server's PYTHONPATH).
    The caller appends its options; server_args.OWNED_ARGS are never among them."""
    return [*map(str, wrapper), str(python), "-m", SERVER_MODULE, "--model", str(model), "--served-model-name",
            served_name, "--host", HOST, "--port", str(port), "--middleware", SERVER_GUARD]


class HttpError(PipelineError):
    """The server answered with an HTTP error: CODE and the start of its body (DETAIL)."""

    def __init__(self, url, code, detail):
        super().__init__(f"{url} answered {code}: {detail}")
        self.url, self.code, self.detail = url, code, detail


class NoAnswer(PipelineError):
    """No answer from the server (refused, reset, timed out): REASON."""

    def __init__(self, url, reason):
        super().__init__(f"no answer from {url} ({reason})")
        self.url, self.reason = url, reason


def post_json(url, body, timeout, headers=None):
    """POST BODY as JSON to URL; the decoded JSON answer. HttpError or NoAnswer otherwise - also for a 200 whose
    body is an error object instead of an answer: vLLM 0.16 answers a completion that way when its engine core has
    died, and a caller that took it for an empty completion would record a reply the target never gave."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http on 127.0.0.1
            answer = json.loads(resp.read())
            status = resp.status
    except urllib.error.HTTPError as exc:
        raise HttpError(url, exc.code, exc.read().decode(errors="replace")[:300]) from None
    except (urllib.error.URLError, OSError) as exc:
        raise NoAnswer(url, exc) from None
    if isinstance(answer, dict) and "error" in answer and "choices" not in answer:
        err = answer["error"] if isinstance(answer["error"], dict) else {"message": answer["error"]}
        raise HttpError(url, err.get("code") or status, str(err.get("message", ""))[:300])
    return answer


def get_text(url, timeout=30, headers=None):
    """GET URL; the body as text. HttpError or NoAnswer otherwise."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as resp:  # noqa: S310
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        raise HttpError(url, exc.code, exc.read().decode(errors="replace")[:300]) from None
    except (urllib.error.URLError, OSError) as exc:
        raise NoAnswer(url, exc) from None


def bearer(api_key):
    """The Authorization header for API_KEY (none when empty)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def listeners(port):
    """[(socket inode, uid)] of every TCP socket in LISTEN state on PORT (any address, IPv4 and IPv6)."""
    found, tables = [], 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.append((int(f[9]), int(f[7])))
    if not tables:
        raise ServeError("cannot tell which process listens on a port: /proc/net/tcp is not readable "
                         "(the server check needs Linux with /proc mounted).")
    return found


def session_sockets(sid):
    """Inodes of the sockets open in the processes of session (or process group) SID."""
    inodes = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
            if sid not in (int(fields[2]), int(fields[3])):
                continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{entry}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(int(link[8:-1]))
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while we looked
    return inodes


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
                 ready_path="/health", auth_path="/v1/models", name="vLLM server", poll_s=0.5,
                 stop_timeout_s=30.0):
        self.argv = [str(a) for a in argv]
        self.host = host
        self.port = int(port)
        self.env = env
        self.log_path = Path(log_path)
        self.ready_timeout_s = float(ready_timeout_s)
        self.ready_path = ready_path if ready_path.startswith("/") else "/" + ready_path
        self.auth_path = auth_path
        self.api_key = None
        self.name = name
        self.poll_s = poll_s
        self.stop_timeout_s = float(stop_timeout_s)
        self.proc = None
        self.startup_s = None
        self._old_handlers = {}

    # -- public API -----------------------------------------------------------------------------------
    def url(self, path=""):
        return f"http://{self.host}:{self.port}{path}"

    def auth_headers(self):
        """The Authorization header our clients send (the server refuses /v1 requests without it)."""
        return bearer(self.api_key)

    def post(self, path, body, timeout):
        """POST BODY to PATH of this server with its key (post_json)."""
        return post_json(self.url(path), body, timeout, self.auth_headers())

    def metrics(self, timeout=30):
        """The server's Prometheus text (GET /metrics with its key)."""
        return get_text(self.url("/metrics"), timeout, self.auth_headers())

    def start(self):
        if self.host != "127.0.0.1":
            raise ServeError(f"{self.name}: host {self.host!r}; the server listens on 127.0.0.1 only.")
        if port_in_use(self.host, self.port):
            raise ServeError(f"{self.name}: port {self.host}:{self.port} is already in use; stop whatever "
                             "listens there or choose another port.")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (self.env or {}).items()})
        # The server imports the guard (SERVER_GUARD) from this package: its folder leads the server's PYTHONPATH.
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != CODE_DIR]
        env["PYTHONPATH"] = os.pathsep.join([CODE_DIR, *paths])
        env["PATH"] = programs_path(self.argv, env.get("PATH", os.defpath))
        self.api_key = secrets.token_urlsafe(32)
        env["VLLM_API_KEY"] = self.api_key  # the environment only: /proc/<pid>/environ is private to the user
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

    def __exit__(self, exc_type, *exc):
        try:
            if exc_type is None and self.proc is not None:
                self.check_ours()
        finally:
            self.stop()
        return False

    def check_ours(self):
        """Raise ServeError unless the server still runs and the socket on its port is still its own."""
        rc = self.proc.poll() if self.proc is not None else "unknown"
        if rc is not None:
            raise ServeError(f"{self.name} {exit_text(rc)} before the measurement was complete; what answered "
                             f"on port {self.port} afterwards is not trusted. Its log is {self.log_path}.")
        if not self._listening_is_ours():
            raise ServeError(f"{self.name} no longer listens on {self.host}:{self.port}; its log is {self.log_path}.")

    # -- internals ------------------------------------------------------------------------------------
    def _listening_is_ours(self):
        """True when the server's session holds every socket listening on the port, False when none listens;
        ServeError naming the owner's uid when another process holds one."""
        for attempt in range(2):
            found = listeners(self.port)
            if not found:
                return False
            ours = session_sockets(self.proc.pid)  # start_new_session: the leader's pid is the session id
            foreign = [uid for inode, uid in found if inode not in ours]
            if not foreign:
                return True
            if attempt == 0:
                time.sleep(0.05)  # a socket opened while we looked
        raise ServeError(f"{self.name}: port {self.host}:{self.port} is held by a process that is not the server "
                         f"we started (listening socket of uid {foreign[0]}); another program took the port - "
                         "stop it or choose another port.")

    def _get_status(self, path, headers=None):
        req = urllib.request.Request(self.url(path), headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - http on 127.0.0.1
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _check_key(self):
        """The server requires our key: AUTH_PATH answers 200 with it and 401 (or 403) without it."""
        url = self.url(self.auth_path)
        without = self._get_status(self.auth_path)
        if without not in (401, 403):
            raise ServeError(f"{self.name}: {url} answered {without} without the API key, expected 401; the server "
                             "does not enforce VLLM_API_KEY (do not pass --api-key in the server arguments).")
        with_key = self._get_status(self.auth_path, self.auth_headers())
        if with_key != 200:
            raise ServeError(f"{self.name}: {url} answered {with_key} with the server's own API key, expected 200; "
                             f"see its log {self.log_path}.")
        probe = self._get_status(GUARD_PROBE_PATH)
        if probe not in (401, 403):
            raise ServeError(f"{self.name}: {self.url(GUARD_PROBE_PATH)} answered {probe} without the API key, expected "
                             f"401; the server does not run the guard {SERVER_GUARD} (every route but /health needs "
                             "the key) - start it with serve.vllm_argv, whose --middleware loads the guard.")

    def _wait_ready(self, started):
        deadline = started + self.ready_timeout_s
        url = self.url(self.ready_path)
        while True:
            ours = self._listening_is_ours()  # before the exit check: a squatter is named even if the server died
            rc = self.proc.poll()
            if rc is not None:
                raise ServeError(f"{self.name} {exit_text(rc)} while starting; "
                                 f"its log is {self.log_path} (see the end of it).")
            if ours and self._get_status(self.ready_path) == 200:
                self._check_key()
                return
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
