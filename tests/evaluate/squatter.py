"""Another local user's listener for the spoofing tests: it takes PORT and answers everything a client of a vLLM
server asks - /health and /v1/models with 200 whatever the key, completions with made-up numbers naming HS_PATH as
the hidden-states file, and a /metrics whose spec-decode counters promise a superb draft (AL 3.8) and grow with
every scrape. It logs every request (method, path, Authorization header) to LOG and creates READY once it listens.
The tests run it as `nobody` with the source passed through -c (so no file of the checkout needs to be readable).

    python3 -c SOURCE PORT READY LOG HS_PATH
"""

import http.server
import json
import sys

port, ready, log, hs_path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
scrapes = [0]


def metrics_text():
    scrapes[0] += 1
    n = scrapes[0]
    return "".join(f"vllm:{name} {value * n}.0\n" for name, value in (
        ("spec_decode_num_drafts_total", 100), ("spec_decode_num_draft_tokens_total", 300),
        ("spec_decode_num_accepted_tokens_total", 280), ("request_success_total", 4)))


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, body, kind="application/json"):
        with open(log, "a") as f:
            f.write(json.dumps([self.command, self.path, self.headers.get("Authorization")]) + "\n")
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/metrics":
            self._answer(metrics_text(), "text/plain")
        else:
            self._answer(json.dumps({"object": "list", "data": [{"id": "specdec-target"}]}))

    def do_POST(self):  # noqa: N802
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        tokens = int(req.get("max_tokens") or 1)
        self._answer(json.dumps({
            "choices": [{"text": "x" * tokens, "message": {"content": "x" * tokens},
                         "prompt_token_ids": req.get("prompt")}],
            "usage": {"completion_tokens": tokens},
            "kv_transfer_params": {"hidden_states_path": hs_path}}))


server = http.server.HTTPServer(("127.0.0.1", port), Handler)
open(ready, "w").close()
server.serve_forever()
