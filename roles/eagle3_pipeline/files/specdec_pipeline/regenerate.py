"""Step 0 - regenerate: the target answers every training prompt itself (on-policy data for the draft).

Switched by regenerate.enabled (eagle3_pipeline_regenerate); when off the step records that and prepare trains on
the dataset's own replies. When on, prepare's selection of training conversations (select: held-out prompts and
the conversations sharing them left out, max_samples) is answered by a managed vLLM server of the target
(vllm_server: the extraction server's settings) turn by turn: each user turn, with the target's own earlier
replies as history, is rendered in the run's chat mode (chatmode.render, the template's own switch) and completed
with the recorded sampling settings; stop at EOS, at most regenerate.max_tokens (and what the context leaves).

Every reply is stored with its finish reason. A reply cut off at the length limit ("length") or without content is
counted and reported, and the conversation ends before it: by default it is never trained on (prepare keeps the
complete turns before it; a conversation with none is dropped). The cut reply is stored beside the record
("cut_turn"); with regenerate.keep_truncated (eagle3_pipeline_regenerate_keep_truncated) prepare trains on it up to
the cut - never on an end of turn the target did not write - and counts it (a setting of prepare: switching it
regenerates nothing).

Resume: one JSON file per conversation (conversations/c_<source index>.json, written atomically) and the ledger of
finished work (finished.jsonl, ledger.py) - a SIGKILL loses only the conversations in flight, a re-run answers
exactly those. Changed settings (sampling, chat mode, target, dataset) regenerate in regenerate.new/ while the
finished answers stay in regenerate/ until the new ones are complete and swapped in (fsutil.plan_step_dir).
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from specdec_pipeline import chatmode, config, ledger, manifest, selection, versions, vllm_server
from specdec_pipeline.target import load_tokenizer
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import atomic_path, open_step_dir, sha256_file, swap_in, write_json
from specdec_pipeline.progress import Progress, log
from specdec_pipeline.serve import SERVED_NAME, HttpError, NoAnswer

STEP = "regenerate"
OUTPUT = "responses.jsonl"
TRUNCATED, EMPTY = "length", "empty"


def settings(cfg):
    """The regenerate settings, checked: {enabled, temperature, top_p, max_tokens, seed, concurrency}."""
    reg = cfg["regenerate"]
    for key, var in (("enabled", "eagle3_pipeline_regenerate"),
                     ("keep_truncated", "eagle3_pipeline_regenerate_keep_truncated")):
        if not isinstance(reg[key], bool):
            raise PipelineError(f"regenerate.{key} is {reg[key]!r}; expected true or false ({var}).")
    checks = (("temperature", float, 0.0, None, "eagle3_pipeline_regenerate_temperature"),
              ("top_p", float, 1e-9, 1.0, "eagle3_pipeline_regenerate_top_p"),
              ("max_tokens", int, 1, None, "eagle3_pipeline_regenerate_max_tokens"),
              ("seed", int, 0, None, "eagle3_pipeline_regenerate_seed"),
              ("concurrency", int, 1, None, "eagle3_pipeline_regenerate_concurrency"))
    for key, kind, low, high, var in checks:
        value = reg[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or value == int(value))
        if not ok or value < low or (high is not None and value > high):
            bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
            what = "a number" if kind is float else "a whole number"
            raise PipelineError(f"regenerate.{key} is {value!r}; expected {what} {bound} ({var}).")
    return reg


def sampling(cfg):
    """What the manifest records and every request sends (temperature, top_p, max_tokens, seed)."""
    reg = cfg["regenerate"]
    return {"temperature": float(reg["temperature"]), "top_p": float(reg["top_p"]),
            "max_tokens": int(reg["max_tokens"]), "seed": int(reg["seed"])}


def training_indices(cfg, convs):
    """The source indices prepare trains on (selection.select), in its order."""
    return selection.select(cfg, convs)["order"]


def _load(cfg):
    """The dataset's conversations; one line when there are none."""
    from specdec_pipeline.datasets_io import load_conversations  # noqa: PLC0415

    convs = load_conversations(cfg["dataset"]["source"], cfg["dataset"]["split"])
    if not convs:
        raise PipelineError(f"dataset {cfg['dataset']['source']}: no conversations in it; expected at least one "
                            "record with a conversation (fix eagle3_pipeline_dataset).")
    return convs


def _plan(cfg):
    """Everything regenerate decides before it writes, reading only: settings, chat mode against the template,
    the prompts (a bad or empty dataset is one line here, before any server starts), where it builds, what is
    left."""
    settings(cfg)
    if not cfg["regenerate"]["enabled"]:
        return {"enabled": False}
    tok = load_tokenizer(cfg)
    chatmode.check(cfg, tok)
    convs = _load(cfg)
    order = training_indices(cfg, convs)
    empty = [i for i in order if not any(m["role"] == "user" for m in convs[i])]
    if len(empty) == len(order):
        raise PipelineError(f"regenerate: none of the {len(order)} training conversations of "
                            f"{cfg['dataset']['source']} has a user turn to answer; check the dataset's roles.")
    work, discard, identity = manifest.plan_dir(cfg, STEP)
    finished = {} if discard else ledger.read(work / "finished.jsonl")
    todo = [i for i in order if i not in finished]
    return {"enabled": True, "tok": tok, "convs": convs, "order": order, "work": work, "discard": discard,
            "identity": identity, "finished": finished, "todo": todo}


def check(cfg):
    """The regenerate settings (and, when the step would run, the chat mode and the prompts), reading only."""
    settings(cfg)
    if cfg["regenerate"]["enabled"] and not manifest.is_current(cfg, STEP)[0]:
        _plan(cfg)


def server_argv(cfg, port):
    """The target's server with the extraction server's settings (vllm_server.argv), without the hidden-states
    method: a plain generation server."""
    return vllm_server.argv(cfg, port)


def stop_ids(tok, cfg):
    """Token ids that end a reply (the tokenizer's EOS and the target's generation_config eos_token_id)."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    path = Path(cfg["target"]["path"]) / "generation_config.json"
    if path.is_file():
        try:
            eos = json.loads(path.read_text()).get("eos_token_id")
        except ValueError:
            eos = None
        ids |= set(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return ids


def answer_conversation(post, tok, cfg, index, messages, stops):
    """The conversation MESSAGES answered turn by turn through POST(body) -> the server's JSON answer.

    Returns the record stored for it: the new messages (complete replies only), one entry per requested turn
    with its finish reason and token count, and the problem that ended it early ('length', 'empty' or '')."""
    mode, samp = cfg["chat_mode"], sampling(cfg)
    limit = config.max_model_len(cfg, vllm_server.settings(cfg)["max_model_len"])
    history, turns, problem, cut = [], [], "", []
    user_turns = [n for n, m in enumerate(messages) if m["role"] == "user"]
    for n, msg in enumerate(messages):
        if msg["role"] == "assistant":
            continue  # the dataset's reply is replaced by the target's own
        history.append({"role": msg["role"], "content": msg["content"]})
        if msg["role"] != "user":
            continue
        prompt = chatmode.prompt_ids(tok, history, mode)
        room = limit - len(prompt)
        if room < 1:
            break  # the history fills the context: prepare cuts there anyway (seq_length)
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": min(samp["max_tokens"], room),
                "temperature": samp["temperature"], "top_p": samp["top_p"],
                "seed": samp["seed"] * 1_000_003 + index * 1009 + user_turns.index(n),
                "return_token_ids": True, "skip_special_tokens": False}
        choice = (post(body).get("choices") or [{}])[0]
        ids = list(choice.get("token_ids") or [])
        reason = choice.get("finish_reason") or ""
        while ids and ids[-1] in stops:
            ids.pop()
        reasoning, content = chatmode.split_reasoning(tok.decode(ids, skip_special_tokens=False), mode)
        turn = {"finish_reason": reason, "completion_tokens": len(choice.get("token_ids") or [])}
        turns.append(turn)
        if reason == "length":
            problem = TRUNCATED
        elif not content:
            problem = EMPTY
        if problem:
            turn["problem"] = problem
            if problem == TRUNCATED and (content or reasoning):  # kept aside: prepare may train on it up to the cut
                reply = {"role": "assistant", "content": content, "truncated": True}
                if reasoning:
                    reply["reasoning_content"] = reasoning
                cut = [history[-1], reply]
            history.pop()  # the unanswered user turn is not kept
            break
        reply = {"role": "assistant", "content": content}
        if reasoning:
            reply["reasoning_content"] = reasoning
        history.append(reply)
    while history and history[-1]["role"] != "assistant":
        history.pop()
    usable = any(m["role"] == "assistant" for m in history)
    rec = {"source_index": index, "messages": history if usable else [], "turns": turns, "problem": problem,
           "usable": usable}
    if cut:
        rec["cut_turn"] = cut
    return rec


def _post(srv, timeout):
    def post(body):
        try:
            return srv.post("/v1/completions", body, timeout)
        except HttpError as exc:
            raise PipelineError(f"regenerate: the server refused a request ({exc.code}: {exc.detail}); see "
                                f"{srv.log_path}.") from None
        except NoAnswer as exc:
            raise PipelineError(f"regenerate: no answer from the server ({exc.reason}); see {srv.log_path}.") from None
    return post


def _conv_path(work, index):
    return work / "conversations" / f"c_{index}.json"


def _store(work, finished_path, rec):
    dest = _conv_path(work, rec["source_index"])
    with atomic_path(dest) as tmp:
        tmp.write_text(json.dumps(rec, separators=(",", ":"), ensure_ascii=False), encoding="utf-8")
    tokens = sum(t["completion_tokens"] for t in rec["turns"])
    ledger.append(finished_path, {"id": rec["source_index"], "tokens": tokens, "size": dest.stat().st_size,
                                  "sha256": sha256_file(dest)})


def run(cfg):
    started = time.time()
    plan = _plan(cfg)  # every setting and the prompts are checked before anything is written
    if not plan["enabled"]:
        log.info("regenerate: off (regenerate.enabled false) - prepare trains on the dataset's own replies")
        return manifest.write(cfg, STEP, {}, {"enabled": False}, started, extra={"regenerate": {"enabled": False}})
    work, final, tok, convs = plan["work"], config.run_path(cfg, STEP), plan["tok"], plan["convs"]
    if work != final:
        log.info("regenerate: settings changed - regenerating in %s; the answers in %s are kept until the new ones "
                 "are complete", work, final)
    open_step_dir(STEP, work, plan["discard"], plan["identity"])
    (work / "conversations").mkdir(exist_ok=True)
    finished_path = work / "finished.jsonl"
    ledger.read(finished_path, repair=True)  # a torn last line of a killed run: the next append starts a line
    todo, order = plan["todo"], plan["order"]
    log.info("regenerate: %d conversations, %d finished, %d to do; chat mode %s; sampling %s", len(order),
             len(order) - len(todo), len(todo), cfg["chat_mode"], sampling(cfg))
    prog = Progress(config.run_path(cfg, "progress.json"), STEP, len(order), unit="conversations")
    prog.resume_from(len(order) - len(todo))
    if todo:
        stops = stop_ids(tok, cfg)
        port = vllm_server.port(cfg)
        argv = server_argv(cfg, port)
        log.info("regenerate: starting the server: %s", " ".join(argv))
        with vllm_server.start(cfg, argv, port, config.run_path(cfg, "logs", "regenerate-server.log"),
                               name="regenerate server") as srv:
            post = _post(srv, vllm_server.request_timeout(cfg))
            done = len(order) - len(todo)
            with ThreadPoolExecutor(int(cfg["regenerate"]["concurrency"])) as pool:
                futures = {pool.submit(answer_conversation, post, tok, cfg, i, convs[i], stops): i for i in todo}
                for fut in as_completed(futures):
                    rec = fut.result()
                    _store(work, finished_path, rec)  # written and in the ledger: never answered again
                    done += 1
                    prog.update(done, tokens=sum(t["completion_tokens"] for t in rec["turns"]))
    prog.finish(f"{len(order)} conversations")
    return _finish(cfg, plan, work, final, started)


def _finish(cfg, plan, work, final, started):
    finished = ledger.read(work / "finished.jsonl")
    missing = [i for i in plan["order"] if i not in finished]
    if missing:
        raise PipelineError(f"regenerate: {work / 'finished.jsonl'} lacks {len(missing)} of {len(plan['order'])} "
                            "conversations; re-run the pipeline to resume.")
    records = []
    for i in plan["order"]:
        path = _conv_path(work, i)
        if sha256_file(path) != finished[i]["sha256"]:
            raise PipelineError(f"regenerate: {path} differs from its record in {work / 'finished.jsonl'}; delete "
                                "both and re-run (that conversation is answered again).")
        records.append(json.loads(path.read_text(encoding="utf-8")))
    with atomic_path(work / OUTPUT) as tmp:
        tmp.write_text("".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n" for r in records),
                       encoding="utf-8")
    turns = [t for r in records for t in r["turns"]]
    counts = {"enabled": True, "conversations": len(records), "usable": sum(r["usable"] for r in records),
              "dropped": sum(not r["usable"] for r in records), "turns": len(turns),
              "truncated": sum(t.get("problem") == TRUNCATED for t in turns),
              "empty": sum(t.get("problem") == EMPTY for t in turns),
              "completion_tokens": sum(t["completion_tokens"] for t in turns)}
    if (counts["truncated"] or counts["empty"]) and cfg["regenerate"].get("keep_truncated"):
        log.warning("regenerate: %d replies cut off at the length limit (prepare trains on them up to the cut: "
                    "eagle3_pipeline_regenerate_keep_truncated) and %d without content (not kept)", counts["truncated"],
                    counts["empty"])
    elif counts["truncated"] or counts["empty"]:
        log.warning("regenerate: %d replies cut off at the length limit and %d without content were not kept (the "
                    "conversation ends before them; %d conversations without a complete reply are dropped) - raise "
                    "eagle3_pipeline_regenerate_max_tokens if many are cut off, or train on them up to the cut "
                    "(eagle3_pipeline_regenerate_keep_truncated)", counts["truncated"], counts["empty"],
                    counts["dropped"])
    found = versions.vllm()
    engine = {"engine": "vllm", "vllm_distribution": found[0] if found else None,
              "vllm": found[1] if found else None}
    write_json(work / "regenerate.json", {"target": cfg["target"]["path"], **engine, "chat_mode": cfg["chat_mode"],
                                          "sampling": sampling(cfg), "counts": counts})
    if work != final:
        log.info("regenerate: the new answers are complete - replacing %s", final)
        swap_in(work, final)
    outputs = manifest.describe_outputs(cfg, [final / OUTPUT])
    extra = {"regenerate": {"enabled": True, "target": cfg["target"]["path"], **engine, "chat_mode": cfg["chat_mode"],
                            "template_switch": chatmode.template_modes(plan["tok"])[0], "sampling": sampling(cfg),
                            "server": "managed vLLM server (the extraction server's settings)"}}
    return manifest.write(cfg, STEP, outputs, counts, started, extra=extra)


def conversations_for_training(cfg, convs, order):
    """CONVS with the target's own answers in place of the dataset's for the training indices ORDER, the indices
    whose regeneration left nothing to train on (dropped) and the indices whose last reply is one cut off at the
    length limit, kept up to the cut (regenerate.keep_truncated). CONVS unchanged when regenerate is off."""
    if not cfg["regenerate"]["enabled"]:
        return convs, [], []
    path = config.run_path(cfg, STEP, OUTPUT)
    try:
        records = {r["source_index"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if r}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PipelineError(f"prepare: cannot read the regenerated answers {path} ({exc}); re-run the pipeline "
                            "(the regenerate step runs again).") from None
    missing = [i for i in order if i not in records]
    if missing:
        raise PipelineError(f"prepare: {path} has no answers for {len(missing)} training conversations (e.g. source "
                            f"index {missing[0]}); the regenerate step ran with other data - re-run the pipeline.")
    out = list(convs)
    dropped, cut = [], []
    keep = bool(cfg["regenerate"].get("keep_truncated"))
    for i in order:
        rec = records[i]
        if keep and rec.get("cut_turn"):
            out[i] = rec["messages"] + rec["cut_turn"]
            cut.append(i)
        elif rec["usable"]:
            out[i] = rec["messages"]
        else:
            dropped.append(i)
    return out, dropped, cut
