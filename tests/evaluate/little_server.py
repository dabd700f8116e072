"""A real small server process for the lifecycle tests: it spawns a child (as vLLM spawns workers), writes both
pids to PIDFILE, then serves GET /health and, with the key in VLLM_API_KEY as a bearer token, every other path
(GET /v1/models answers 200) (serve), never answers (sleep), exits with status 3 (die), binds only once the file GATE
exists (late: a squatter can take the port first; the bind failing ends it with status 1), answers /v1/models without
the key (nokey), or asks for the key under /v1 only, as vLLM's own check does (v1only).

    little_server.py MODE PORT PIDFILE [GATE]
"""

import http.server
import os
import subprocess
import sys
import time

mode, port, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(pidfile, "w") as f:
    f.write(f"{child.pid}\n")
print(f"little server: mode {mode}, child {child.pid}", flush=True)
if mode == "die":
    print("little server: failing at start on purpose", flush=True)
    sys.exit(3)
if mode == "sleep":
    time.sleep(600)
if mode == "late":
    while not os.path.exists(sys.argv[4]):
        time.sleep(0.05)
KEY = os.environ.get("VLLM_API_KEY", "")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/health":
            code = 200
        elif self.path.startswith("/v1/") or mode not in ("nokey", "v1only"):
            ok = mode == "nokey" or self.headers.get("Authorization") == f"Bearer {KEY}"
            code = (200 if self.path == "/v1/models" else 404) if ok else 401
        else:
            code = 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok\n")


try:
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
except OSError as exc:
    print(f"little server: cannot bind 127.0.0.1:{port} ({exc})", flush=True)
    sys.exit(1)
server.serve_forever()
