"""serve.post_json against a real HTTP server: an answer that is an error object is an error, whatever its status.

vLLM 0.16's OpenAI server answers a completion with status 200 and {"error": {..., "code": 500}} once its engine
core has died (seen on a CPU whose attention kernel refused the target's head size); the regenerate step took such
an answer for an empty reply and recorded the conversation as answered, so a resumed run never asked it again.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdec_pipeline import regenerate
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.serve import HttpError, post_json

DEAD_ENGINE = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                         "type": "InternalServerError", "param": None, "code": 500}}
ANSWER = {"choices": [{"text": "x", "finish_reason": "length", "token_ids": [5]}], "usage": {"completion_tokens": 1}}


@pytest.fixture()
def url():
    bodies = {"/dead": DEAD_ENGINE, "/ok": ANSWER, "/plain-error": {"error": "overloaded"}}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server interface
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps(bodies[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_an_error_object_with_status_200_is_an_http_error(url):
    with pytest.raises(HttpError) as err:
        post_json(url + "/dead", {"prompt": [1]}, 10)
    assert err.value.code == 500 and err.value.detail.startswith("EngineCore encountered an issue")
    with pytest.raises(HttpError) as err:
        post_json(url + "/plain-error", {"prompt": [1]}, 10)
    assert err.value.code == 200 and err.value.detail == "overloaded"
    assert post_json(url + "/ok", {"prompt": [1]}, 10) == ANSWER


def test_the_regenerate_step_stops_on_it_in_one_line_naming_the_log(url, tmp_path):
    class Server:
        log_path = tmp_path / "regenerate-server.log"

        @staticmethod
        def post(path, body, timeout):
            return post_json(url + "/dead", body, timeout)

    with pytest.raises(PipelineError) as err:
        regenerate._post(Server, 10)({"prompt": [1]})  # pylint: disable=protected-access
    said = str(err.value)
    assert "\n" not in said and "500" in said and "EngineCore encountered an issue" in said
    assert str(Server.log_path) in said
