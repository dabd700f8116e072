"""Per-epoch validation figures of a draft's training, read from its `speculators train` log, and the epoch to export.

What: `read_log(path, algo, build)` turns the train step's log (logs/train.log, train-<algo>.log; appended across runs)
into {epoch: figures} of one build, and `choose(per_epoch, epochs)` names the checkpoint to export: the epoch with
the highest validation acceptance (`expected_al`; a tie goes to the later epoch), else the last epoch, with the
reason in one line. `marker(build, epochs)` is the line the train step writes into the log before each launch.

Why: the last epoch is not always the best one (a small set overfits), and speculators 0.9 keeps no complete record:
it writes checkpoints/<epoch>/val_metrics.json only for an epoch that lowers the validation loss, and by loss, not by
acceptance. Its log has every epoch's figures.

Facts (speculators 0.9.0, speculators/train/trainer.py val_epoch, logger.py FormatDictFilter):
- after each epoch's checkpoint it validates on the held-out 1 - train_data_ratio of the samples and logs one record
  `val/<metric>_epoch=<value>, ..., epoch=<n>` (the dict flattened with '/', floats as %.3f, or %.2e below 0.001 or
  above 999; nan and inf as such); an empty validation split logs `epoch=<n>` alone; a run killed while it
  validates leaves that epoch's checkpoint without figures (a resumed run starts with the next epoch);
- EAGLE-3 drafts (models/eagle3/metrics.py) log loss_epoch and, per draft position k, full_acc_k_epoch (position k and
  every earlier one right: the chance that k + 1 drafted tokens are accepted) and cond_acc_k_epoch (k right given the
  earlier ones were), so the expected accepted length per step, bonus token included, is 1 + sum_k full_acc_k;
- DFlash-family drafts (models/dflash/metrics.py) log loss_epoch, full_acc_epoch, position_<p>_acc_epoch (each
  block position on its own, not chained; p from 1 for dflash, whose position 0 is the anchor, from 0 for dspark)
  and eal_epoch, the expected accepted length per block including the bonus token (vLLM's convention);
- rich's RichHandler prints the record behind a time and level column and before a file:line column, and wraps it
  inside the message column at the console's width (80 unless COLUMNS is set; a word longer than the column is
  cut): `sections` joins the lines again. torchrun may prefix lines with [rankN]:.

Standard library only.
"""

import math
import re

from specdec_pipeline.algorithms import BLOCK_FAMILY
from specdec_pipeline.errors import PipelineError

MARK = "specdec-pipeline: speculators train of build "
_MARKER = re.compile(r"^" + re.escape(MARK) + r"(?P<build>\S+) starts with epoch checkpoints (?P<epochs>\[[\d, ]*\])")
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_HEAD = re.compile(r"^\s*(?:\[[^\]]*\]\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+")
_PATH = re.compile(r"(?<=\s)[\w.<>-]+\.py:\d+$")  # the file:line column of a record's first line
_ITEM = re.compile(r"^([A-Za-z_][\w/.]*)=(\S+)")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:nan|inf)$")


def marker(build, epochs):
    """The line the train step writes into the log before `speculators train` starts: BUILD (the build's identity
    digest), EPOCHS (the checkpoints already there; none: a fresh start, whose records replace every earlier one)."""
    return f"{MARK}{build} starts with epoch checkpoints {sorted(epochs)}\n"


def _lines(source):
    if isinstance(source, str):
        source = source.replace("\r", "\n").split("\n")
    for raw in source:  # a file opened in text mode splits at \r too (tqdm's progress lines)
        yield _RANK_PREFIX.sub("", _ANSI.sub("", raw)).rstrip()


def sections(source):
    """The log SOURCE (its text, or its lines) cut at the marker lines: [(build, fresh, messages)], the first
    (None, False, ...) for what comes before any marker. A message is a record that can be a validation one (it
    starts with val/ or epoch=): its wrapped lines joined, time, level and file:line taken off."""
    out = [(None, False, [])]
    parts, cols = None, None
    for line in _lines(source):
        mark = _MARKER.match(line)
        head = None if mark else _HEAD.match(line)
        if (parts is not None and not mark and not head and line[:1].isspace() and not line[:cols[0]].strip()
                and line[cols[0]:].strip()):  # a continuation: the message column of the record's first line
            parts.append(line[cols[0]:cols[1]].strip())
            continue
        if parts:
            out[-1][2].append("".join(parts))
        parts = None
        if mark:
            out.append((mark["build"], mark["epochs"] == "[]", []))
        elif head and line.startswith(("val/", "epoch="), head.end()):  # others (a step's record): skipped unread
            path = _PATH.search(line, head.end())
            cols = (head.end(), path.start() if path else None)
            parts = [line[cols[0]:cols[1]].strip()]
    if parts:
        out[-1][2].append("".join(parts))
    return out


def _build_records(source, build):
    """The messages of BUILD's validation records in the log SOURCE: those of its runs after its last fresh start
    (earlier ones belong to an earlier build of the same settings) and - when the log has no fresh start of BUILD -
    those before any marker (a log written before the train step marked its runs). BUILD None: every record."""
    cut = sections(source)
    if build is None:
        return [m for _b, _f, msgs in cut for m in msgs]
    fresh = [i for i, (b, f, _m) in enumerate(cut) if b == build and f]
    if fresh:
        cut = cut[fresh[-1]:]
    return [m for b, _f, msgs in cut if b == build or (b is None and not fresh) for m in msgs]


def _items(message):
    """{key: raw value} of a `key=value, key=value` message (cut words joined again by sections)."""
    out = {}
    for item in message.split(","):
        m = _ITEM.match(item.strip())
        if m:
            out[m[1]] = m[2]
    return out


def _number(items, key, low=None, high=None):
    raw = items.get(key)
    if raw is None:
        raise ValueError(f"no {key}")
    value = float(raw) if _NUMBER.match(raw) else math.nan
    if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
        want = "a finite number" + (f" in [{low}, {high}]" if low is not None and high is not None else
                                    f" of at least {low}" if low is not None else "")
        raise ValueError(f"{key} is {raw!r}, not {want}")
    return value


def _positions(items, name):
    """The sorted positions n of the keys val/<NAME with n>_epoch ('full_acc_{}'); a gap is a damaged record."""
    pattern = f"val/{name}_epoch".replace("{}", r"(\d+)")  # names of word characters only
    found = sorted(int(m[1]) for k in items if (m := re.fullmatch(pattern, k)))
    if not found:
        raise ValueError(f"no val/{name.format('<n>')}_epoch")
    if found != list(range(found[0], found[-1] + 1)):
        raise ValueError(f"positions {found} have a gap")
    return found


def figures(items, algo):
    """The figures of one validation record's ITEMS for ALGO; ValueError naming the key when one is missing or not a
    number in its range."""
    loss = round(_number(items, "val/loss_epoch"), 6)
    if algo in BLOCK_FAMILY:
        pos = _positions(items, "position_{}_acc")
        acc = [_number(items, f"val/position_{p}_acc_epoch", 0, 1) for p in pos]
        return {"loss": loss, "position_acc": acc, "expected_al": round(_number(items, "val/eal_epoch", 1), 6)}
    ks = _positions(items, "full_acc_{}")
    if ks[0] != 0:
        raise ValueError(f"full_acc positions start at {ks[0]}, expected 0")
    full = [_number(items, f"val/full_acc_{k}_epoch", 0, 1) for k in ks]
    cond = [_number(items, f"val/cond_acc_{k}_epoch", 0, 1) for k in ks]
    return {"loss": loss, "full_acc": full, "cond_acc": cond, "expected_al": round(1 + sum(full), 6)}


def read(source, algo, build=None):
    """(per_epoch, left_out) of BUILD's validation records in SOURCE (a train log's text or lines).

    per_epoch: {epoch: figures} - for EAGLE-3 {"loss", "full_acc": [per position], "cond_acc": [...], "expected_al":
    1 + sum(full_acc)}, for the DFlash family {"loss", "position_acc": [per drafted token], "expected_al": eal} - the
    latest record of an epoch winning (a resumed run appends to the log); left_out: {epoch: why} for an epoch whose
    latest record is unusable (an empty validation split, a damaged or missing number). BUILD None: every record."""
    per_epoch, left_out = {}, {}
    for msg in _build_records(source, build):
        items = _items(msg)
        if "epoch" not in items or not (set(items) == {"epoch"} or any(k.startswith("val/") for k in items)):
            continue  # not a validation record (a training step's has train/ keys and global_step)
        if not items["epoch"].isdigit():
            continue  # its epoch is unreadable: nothing to attach it to
        epoch = int(items["epoch"])
        per_epoch.pop(epoch, None)
        left_out.pop(epoch, None)
        try:
            per_epoch[epoch] = figures(items, algo)
        except ValueError as exc:
            left_out[epoch] = ("the validation record has no figures (an empty validation split)"
                               if set(items) == {"epoch"} else f"its validation record: {exc}")
    return per_epoch, left_out


def choose(per_epoch, epochs, left_out=None, log_name="the train log"):
    """(epoch, reason): of EPOCHS (those with a checkpoint), the one with the highest validation expected_al in
    PER_EPOCH - a tie goes to the later epoch - else, with no figures for any of them, the last epoch."""
    epochs = sorted(epochs)
    have = [e for e in epochs if e in per_epoch]
    missing = [e for e in epochs if e not in per_epoch]
    why_missing = "; ".join(f"epoch {e}: {(left_out or {})[e]}" for e in missing if e in (left_out or {}))
    if not have:
        return epochs[-1], (f"the last epoch ({epochs[-1]}): {log_name} has no validation figures for epochs {epochs}"
                            + (f" ({why_missing})" if why_missing else ""))
    best = max(have, key=lambda e: (per_epoch[e]["expected_al"], e))
    last = epochs[-1]
    reason = (f"the highest validation acceptance (expected accepted length {per_epoch[best]['expected_al']:.3f}) "
              f"of epochs {have}: epoch {best}")
    tied = [e for e in have if e != best and per_epoch[e]["expected_al"] == per_epoch[best]["expected_al"]]
    if tied:
        reason += f" (tied with {tied}: the later)"
    if best == last:
        reason += ", the last"
    elif last in per_epoch:
        reason += f" (the last, {last}: {per_epoch[last]['expected_al']:.3f})"
    if missing:
        reason += f"; without figures: {missing}" + (f" ({why_missing})" if why_missing else "")
    return best, reason


def read_log(path, algo, build=None):
    """read() of the log file PATH, line by line (a long training's log is large); ({}, {}) when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return read(f, algo, build)
    except FileNotFoundError:
        return {}, {}
    except OSError as exc:
        raise PipelineError(f"{path}: cannot be read ({exc.strerror or exc}); the epoch to export is chosen from its "
                            "validation records: make it readable by the pipeline's user and re-run.") from None
