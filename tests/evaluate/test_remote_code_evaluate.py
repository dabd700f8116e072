"""The evaluate stage runs a target's own code only with its own switch, names that code first, and stays offline.

The configuration is the one the eagle3_evaluate role renders (a real `ansible-playbook playbooks/evaluate.yml --check
--diff` run of inventory/local-current, with the pipeline's run configuration on disk); the evaluate process is run
as the role runs it (`python -m specdec_pipeline.evaluate CONFIG run`) with the pipeline venv's transformers
(scripts/pipeline-venv). The target's tokenizer is its own code: tokenizer_config.json's auto_map names tok.py, which
says on stderr when it is imported and writes what it saw (the offline settings in effect) to a marker file. A local
HTTP server stands in for the hub (HF_ENDPOINT) and records every request it gets.
"""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "eagle3_pipeline" / "files"
PIPELINE_PY = ROOT / ".cache" / "venvs" / "pipeline" / "bin" / "python"
pytestmark = pytest.mark.skipif(not PIPELINE_PY.exists(), reason=f"run scripts/pipeline-venv first ({PIPELINE_PY})")

TOKENIZER_JSON = {
    "version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None, "decoder": None,
    "added_tokens": [{"id": 3, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True}],
    "pre_tokenizer": {"type": "Whitespace"},
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3}, "unk_token": "[UNK]"},
}
TOK_PY = """\
import json, os, sys
import huggingface_hub.constants
from transformers import PreTrainedTokenizerFast
print("tok.py imported", file=sys.stderr, flush=True)
with open(os.environ["SPECDEC_TEST_MARKER"], "w") as f:
    json.dump({"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"), "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE"),
               "hub_offline_in_effect": huggingface_hub.constants.HF_HUB_OFFLINE}, f)


class MyTok(PreTrainedTokenizerFast):
    pass
"""


def make_target(path, ref="tok.MyTok"):
    path.mkdir()
    (path / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "MyTok", "auto_map": {"AutoTokenizer": [None, ref]}, "eos_token": "</s>",
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))
    (path / "tok.py").write_text(TOK_PY)
    return path


class Hub:
    """A stand-in for the hub on 127.0.0.1: answers 404 and records each request."""

    def __init__(self):
        seen = self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                seen.append(f"{self.command} {self.path}")
                self.send_response(404)
                self.end_headers()

            do_GET = do_HEAD = do_POST = _answer  # noqa: N815 - http.server's naming

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub():
    server = Hub()
    yield server
    server.close()


def rendered_config(tmp_path, target, pipeline_trust, evaluate_trust):
    """The evaluation configuration the role renders from the pipeline's run configuration (trust_remote_code
    PIPELINE_TRUST) and eagle3_evaluate_trust_remote_code EVALUATE_TRUST: check mode, its diff."""
    runs = tmp_path / "work" / "runs"
    runs.mkdir(parents=True)
    (runs / "tiny-current.json").write_text(json.dumps({
        "target": {"path": str(target), "trust_remote_code": pipeline_trust}, "run_dir": str(runs / "tiny-current"),
        "chat_mode": None}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hello world"}]}) + "\n")
    extra = {"ansible_host": "localhost", "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "specdec_prefix": str(tmp_path), "specdec_venv_path": str(tmp_path / "venv"),
             "specdec_work_dir": str(tmp_path / "work"), "eagle3_evaluate_trust_remote_code": evaluate_trust,
             "eagle3_evaluate_prompt_sets": ["jsonl"], "eagle3_evaluate_prompts_jsonl": str(prompts)}
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(ROOT / "inventory" / "local-current"),
                           str(ROOT / "playbooks" / "evaluate.yml"), "--check", "--diff", "-e", json.dumps(extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for play in json.loads(proc.stdout)["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith("Write the evaluation configuration"):
                text = next(iter(task["hosts"].values()))["diff"][0]["after"]
                path = runs / "tiny-current-evaluate.json"
                path.write_text(text)
                return path, json.loads(text)
    raise AssertionError("the role rendered no evaluation configuration")


def evaluate(config, tmp_path, hub):
    """python -m specdec_pipeline.evaluate CONFIG run, as the role runs it (the environment without offline settings
    of its own, the hub stand-in as HF_ENDPOINT); (exit status, stderr lines, marker or None)."""
    marker = tmp_path / "marker.json"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1", HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"),
               SPECDEC_TEST_MARKER=str(marker))
    proc = subprocess.run([str(PIPELINE_PY), "-m", "specdec_pipeline.evaluate", str(config), "run"], env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    print(proc.stderr)
    return proc.returncode, proc.stderr.splitlines(), json.loads(marker.read_text()) if marker.exists() else None


def errors(lines):
    return [line for line in lines if line.startswith("ERROR:")]


def test_the_pipeline_switch_does_not_run_the_tokenizers_code_in_evaluate(tmp_path, hub):
    target = make_target(tmp_path / "target")
    config, cfg = rendered_config(tmp_path, target, pipeline_trust=True, evaluate_trust=False)
    assert cfg["trust_remote_code"] is False  # the stage's own switch, not the pipeline's
    rc, lines, marker = evaluate(config, tmp_path, hub)
    assert marker is None and "tok.py imported" not in lines, "the tokenizer's own code ran"
    assert rc == 2 and not any("Traceback" in line for line in lines), lines
    assert f"evaluate: remote code: trust_remote_code is off - 1 file(s) that auto_map names in {target} do not run " \
           "(tok.py); a target that needs them fails to load (eagle3_evaluate_trust_remote_code)" in lines
    assert errors(lines) == [errors(lines)[-1]] and lines[-1] == errors(lines)[-1], lines
    assert lines[-1].startswith(f"ERROR: {target}: cannot load the tokenizer (")
    assert "eagle3_evaluate_trust_remote_code is false - set it to true only if you trust that code" in lines[-1]
    assert hub.requests == []


@pytest.mark.parametrize("evaluate_trust", [True, False], ids=["evaluate switch on", "evaluate switch off"])
def test_code_of_another_repository_reaches_no_hub(tmp_path, hub, evaluate_trust):
    target = make_target(tmp_path / "target", ref="someone/evil--tok.MyTok")
    config, cfg = rendered_config(tmp_path, target, pipeline_trust=True, evaluate_trust=evaluate_trust)
    assert cfg["trust_remote_code"] is evaluate_trust
    rc, lines, marker = evaluate(config, tmp_path, hub)
    assert hub.requests == [], f"the hub stand-in was asked: {hub.requests}"
    assert marker is None and rc == 2 and len(errors(lines)) == 1 and lines[-1] == errors(lines)[0], lines
    if evaluate_trust:  # refused before anything loads the target, naming the stage's switch
        assert lines[-1] == (f"ERROR: {target}/tokenizer_config.json: auto_map AutoTokenizer is 'someone/evil--tok.MyTok', "
                             f"code of another repository (someone/evil) that is not in {target}; expected module.Class "
                             "of a file in the target directory. Copy that code into the directory and name it there, "
                             "or set eagle3_evaluate_trust_remote_code: false.")
    else:
        assert lines[-1].startswith(f"ERROR: {target}: cannot load the tokenizer (")


def test_with_its_switch_on_the_stage_names_the_code_first_and_is_offline(tmp_path, hub):
    target = make_target(tmp_path / "target")
    config, cfg = rendered_config(tmp_path, target, pipeline_trust=False, evaluate_trust=True)
    assert cfg["trust_remote_code"] is True
    rc, lines, marker = evaluate(config, tmp_path, hub)
    digest = hashlib.sha256((target / "tok.py").read_bytes()).hexdigest()
    said = f"evaluate: remote code: {target}/tok.py runs (trust_remote_code on), sha256 {digest}"
    assert said in lines and "tok.py imported" in lines, lines
    assert lines.index(said) < lines.index("tok.py imported"), "the code ran before it was named"
    assert marker == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "hub_offline_in_effect": True}
    assert hub.requests == []
    # It got as far as the missing export (no pipeline run here): one line.
    assert rc == 2 and errors(lines) == [lines[-1]] and "export/config.json is missing" in lines[-1], lines
