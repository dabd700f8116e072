"""What a conversation dataset source must be - one home for the rule, used by the pipeline's prepare step
(datasets_io) and, before anything changes, by the role's validate tasks, which run this file on its own on the
host as the pipeline user: `python dataset_rules.py SOURCE` prints one JSON line {"problem": ...} per problem and
exits 2 when there is one. Standard library only, no import of the package.

A source is a local file (a path: absolute, or starting with `./`, `../` or `~`, or any name ending in .json or
.jsonl), a local dataset directory (read by the datasets loader, like a hub dataset), or a dataset id of the Hugging
Face hub (`owner/name`, or an alias such as `sharegpt`). A local file is a
JSON list of conversation records, or JSON lines (.jsonl) of them; each record holds a `conversations` (or
`messages`) list of turns with a role (`from`/`role`) and text (`value`/`content`).
"""

import json
import os
import sys

ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
              "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}
LOCAL_SUFFIXES = (".json", ".jsonl")
# What the datasets loader reads from a local dataset directory.
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".txt")
SHOWN = 3  # problems of one kind named before the rest are counted


def kind(source):
    """'directory' (a local dataset directory, read by the datasets loader like a hub dataset), 'file' (a local
    .json/.jsonl file, or any path: absolute, or starting with ./, ../ or ~) or 'hub' (a dataset id)."""
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        return "directory"
    if source.startswith(("/", "./", "../", "~")) or source.endswith(LOCAL_SUFFIXES):
        return "file"
    return "hub"


def is_local(source):
    """Whether SOURCE names a local conversation file (read by the pipeline itself)."""
    return kind(source) == "file"


def directory_problem(source):
    """None when the local dataset directory SOURCE holds data files the datasets loader reads, else one line."""
    path = os.path.expanduser(source)
    what = f"eagle3_pipeline_dataset is '{source}', a directory"
    try:
        found = any(name.endswith(DATA_FILE_SUFFIXES) for _root, _dirs, names in os.walk(path) for name in names)
    except OSError as exc:
        return f"{what} that cannot be read ({exc.strerror}); give the pipeline user read access."
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{what} the pipeline user ({_user()}) cannot read; give that user read access."
    if not found:
        return (f"{what} without data files the datasets loader reads ({', '.join(DATA_FILE_SUFFIXES)}); point it at "
                "a .json or .jsonl file, or a directory of such files.")
    return None


def turns_problem(record, where):
    """None when RECORD is a conversation the pipeline can read, else one line naming WHERE and what to fix."""
    turns = record.get("conversations") or record.get("messages") or record.get("conversation") \
        if isinstance(record, dict) else None
    if not isinstance(turns, list):
        return (f"{where}: expected a 'conversations' (or 'messages') list of {{from/role, value/content}} turns; "
                "fix or drop this record.")
    for turn in turns:
        role = ROLE_NAMES.get(str(turn.get("from", turn.get("role", ""))).lower()) if isinstance(turn, dict) else None
        content = turn.get("value", turn.get("content")) if isinstance(turn, dict) else None
        if role is None or not isinstance(content, str):
            return (f"{where}: turn {turn!r:.80} has no known role (human/gpt/user/assistant/system) or no text; fix "
                    "or drop this record.")
    return None


def records(path, text):
    """(where, record or None, problem or None) for each record of the file's TEXT."""
    if path.endswith(".jsonl"):
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield f"{path}:{n}", json.loads(line), None
                except json.JSONDecodeError as exc:
                    yield f"{path}:{n}", None, f"{path}:{n}: not valid JSON ({exc.msg}); fix the line."
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        yield path, None, f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); fix the file."
        return
    if not isinstance(data, list):
        yield path, None, f"{path}: expected a JSON list of conversation records; fix the file."
        return
    for i, record in enumerate(data):
        yield f"{path}[{i}]", record, None


def read_text(source):
    """The text of the local file SOURCE, or (None, problem) - one line naming the file and what to do."""
    path = os.path.expanduser(source)
    what = f"eagle3_pipeline_dataset is '{source}'"
    if not path.endswith(LOCAL_SUFFIXES):
        return None, (f"{what}, a local path but not a .json or .jsonl file; point it at a JSON list or JSON lines "
                      "of conversations, or give a hub dataset id (owner/name).")
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None, f"{what}, which does not exist on the host; put the file there or correct the path."
    except PermissionError:
        return None, (f"{what}, which the pipeline user ({_user()}) cannot read; give that user read access (and "
                      "passage through every directory above it).")
    except OSError as exc:
        return None, f"{what}, which cannot be read ({exc.strerror}); check the file."
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        return None, (f"{what}, which is not UTF-8 text (byte {exc.start}, line {line}); convert it to UTF-8 "
                      "(e.g. iconv -t UTF-8).")


def problems(source):
    """Every problem of SOURCE, one line each (a hub id: none here - it is fetched at prepare)."""
    if not isinstance(source, str) or not source.strip():
        return [f"eagle3_pipeline_dataset is {source!r}; expected a local .json/.jsonl file or a hub dataset id."]
    where = kind(source)
    if where == "hub":
        return []
    if where == "directory":
        problem = directory_problem(source)
        return [problem] if problem else []
    text, problem = read_text(source)
    if problem:
        return [problem]
    path = os.path.expanduser(source)
    found, count = [], 0
    for where, record, bad in records(path, text):
        count += 1
        bad = bad or turns_problem(record, where)
        if bad:
            found.append(bad)
    if not count:
        return [f"eagle3_pipeline_dataset is '{source}', which holds no conversation; fill it or choose another."]
    if len(found) > SHOWN:
        found = found[:SHOWN] + [f"{path}: {len(found) - SHOWN} more records with problems like the ones above."]
    return found


def _user():
    try:
        import pwd  # noqa: PLC0415 - POSIX only, as the hosts are
        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def main(argv):
    if len(argv) != 1:
        print("usage: python dataset_rules.py SOURCE", file=sys.stderr)
        return 2
    found = problems(argv[0])
    for line in found:
        print(json.dumps({"problem": line}))
    return 2 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
