"""The target's own code (trust_remote_code): which of its *.py files run, their sha256, and the switch.

transformers runs code of a model directory only when trust_remote_code is on and an `auto_map` names it: the
modules named in the files of AUTO_MAP_FILES - config.json (config and model classes, also in nested configs such
as text_config), tokenizer_config.json (tokenizer) and the processor, image/feature and video processor configs -
plus the files those modules import relatively (`from .configuration_deepseek import ...`), transitively. Other *.py files of the directory never run. With the
switch off, nothing of the directory runs (a model whose classes transformers does not ship then fails to load).

Each stage has its own switch (SETTING for the pipeline, eagle3_evaluate_trust_remote_code for the evaluate stage)
and names it in its lines. The pipeline lists those files with their sha256 once per run, records them in the prepare and extract manifests
(a changed file re-runs those steps) and hands the switch to the patched speculators code as
SPECDEC_TRUST_REMOTE_CODE=1|0. An auto_map entry that names another repository (`owner/repo--module.Class`) is
refused: that code is not in the model directory and would come from the hub cache. Every process that loads the
model runs with HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 (OFFLINE_ENV, set before transformers is imported), so
nothing of it is fetched from the network either.
"""

import ast
import json
from functools import cache
from pathlib import Path

from specdec_pipeline.errors import PipelineError
from specdec_pipeline.fsutil import sha256_file

SWITCH_ENV = "SPECDEC_TRUST_REMOTE_CODE"   # read by the patched speculators code (patch_sets: p01, t01)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# The files of a model directory whose auto_map transformers reads (its CONFIG_NAME, TOKENIZER_CONFIG_FILE,
# PROCESSOR_NAME, FEATURE_EXTRACTOR_NAME = IMAGE_PROCESSOR_NAME, VIDEO_PROCESSOR_NAME): the one list of them.
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                  "video_preprocessor_config.json")
SETTING = "eagle3_pipeline_trust_remote_code"  # the pipeline stage's switch; the evaluate stage names its own


def _auto_maps(node):
    """Every auto_map mapping in a parsed config (top level and nested configs)."""
    if isinstance(node, dict):
        if isinstance(node.get("auto_map"), dict):
            yield node["auto_map"]
        for value in node.values():
            yield from _auto_maps(value)
    elif isinstance(node, list):
        for value in node:
            yield from _auto_maps(value)


def _references(value):
    """Class references of one auto_map value: a string, or a list such as [slow tokenizer, fast tokenizer]."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, str):
                yield item


def _relative_imports(path):
    """Files of the same directory that PATH imports relatively (`from .x import y`)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []  # transformers fails on it itself; the file is listed all the same
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.append(node.module.replace(".", "/") + ".py")
    return out


@cache
def files_that_run(model_dir, setting=SETTING):
    """{file name relative to MODEL_DIR: sha256} of the code transformers runs with trust_remote_code on; a refusal
    names SETTING, the switch of the stage that asks."""
    root = Path(model_dir)
    todo = []
    for name in AUTO_MAP_FILES:
        path = root / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PipelineError(f"{path}: cannot be read as JSON ({exc}); the target directory is damaged - "
                                "restore the file.") from None
        for auto_map in _auto_maps(data):
            for key, value in auto_map.items():
                for ref in _references(value):
                    if "--" in ref:
                        raise PipelineError(
                            f"{path}: auto_map {key} is {ref!r}, code of another repository ({ref.split('--')[0]}) "
                            f"that is not in {root}; expected module.Class of a file in the target directory. "
                            "Copy that code into the directory and name it there, or set "
                            f"{setting}: false.")
                    module = ref.rpartition(".")[0]
                    if not module:
                        raise PipelineError(f"{path}: auto_map {key} is {ref!r}; expected module.Class (a *.py file "
                                            f"of {root} and a class in it).")
                    todo.append((path, module.replace(".", "/") + ".py"))
    found = {}
    while todo:
        named_by, rel = todo.pop()
        if rel in found:
            continue
        path = root / rel
        if not path.is_file():
            raise PipelineError(f"{named_by}: names {rel} (auto_map or a relative import), which is not in {root}; "
                                "the target directory is incomplete - copy the model's *.py files into it.")
        found[rel] = sha256_file(path)
        todo.extend((path, dep) for dep in _relative_imports(path))
    return dict(sorted(found.items()))


def record(cfg):
    """What the manifests of the steps that load the model record: the switch and the files that run."""
    trust = bool(cfg["target"]["trust_remote_code"])
    return {"trust_remote_code": trust, "files": files_that_run(str(cfg["target"]["path"])) if trust else {}}


def changes(old, new):
    """A short sentence naming what differs between two records, '' when nothing does."""
    if old == new:
        return ""
    if old.get("trust_remote_code") != new.get("trust_remote_code"):
        return f"trust_remote_code {old.get('trust_remote_code')} -> {new.get('trust_remote_code')}"
    before, after = old.get("files") or {}, new.get("files") or {}
    parts = [f"{n} changed (sha256 {before[n][:12]} -> {after[n][:12]})"
             for n in sorted(set(before) & set(after)) if before[n] != after[n]]
    parts += [f"{n} added" for n in sorted(set(after) - set(before))]
    parts += [f"{n} gone" for n in sorted(set(before) - set(after))]
    return "the target's own code: " + ", ".join(parts)


def announcement(path, trust, setting=SETTING):
    """(lines, files): what to say, before anything loads the target at PATH, about which of its *.py files run
    with the stage's switch TRUST (named SETTING) - each with its sha256 - or that none does; FILES as
    files_that_run. A refused auto_map entry raises PipelineError."""
    if not trust:
        named = _named_quietly(path)
        if not named:
            return [], {}
        return [f"remote code: trust_remote_code is off - {len(named)} file(s) that auto_map names in {path} do not "
                f"run ({', '.join(named)}); a target that needs them fails to load ({setting})"], {}
    files = files_that_run(str(path), setting)
    if not files:
        return [f"remote code: trust_remote_code is on, but {path} names no code of its own (no auto_map): none "
                "runs"], files
    return [f"remote code: {path}/{name} runs (trust_remote_code on), sha256 {digest}"
            for name, digest in files.items()], files


def announce(cfg, log):
    """Say once which *.py files of the target will run (name and sha256), or that none will."""
    lines, files = announcement(cfg["target"]["path"], cfg["target"]["trust_remote_code"])
    for line in lines:
        log.info("%s", line)
    return files


def _named_quietly(path):
    try:
        return list(files_that_run(str(path)))
    except PipelineError:
        return []


def switch_env(cfg):
    """Environment of every process that loads the target: the switch for patched speculators, offline hub."""
    return {SWITCH_ENV: "1" if cfg["target"]["trust_remote_code"] else "0", **OFFLINE_ENV}


def hint(path, trust, setting=SETTING):
    """A hint for a failed load of the target at PATH: the setting to turn on when it names code of its own."""
    if trust:
        return ""
    named = _named_quietly(path)
    if not named:
        return ""
    return (f"; the target names its own code ({', '.join(named)}) and {setting} is false - set it to true only "
            "if you trust that code")
