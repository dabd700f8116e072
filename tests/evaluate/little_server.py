"""A real small server process for the lifecycle tests: it spawns a child (as vLLM spawns workers), writes both
pids to PIDFILE, then serves GET /health (serve), never answers (sleep) or exits with status 3 (die)."""

import http.server
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


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"ok\n")


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
