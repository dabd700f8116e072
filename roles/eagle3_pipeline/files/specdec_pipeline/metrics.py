"""Speculative-decoding counters from a vLLM server's Prometheus text (`GET /metrics`).

vLLM (0.16 to 0.34) exports the counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens` and `..._num_accepted_tokens_per_pos{position="k"}`; the Prometheus client adds
`_total` to counter samples (and `_created` timestamps, which are ignored). Values of several label sets
(engines, model names) are summed. Acceptance length (AL) counts the bonus token: AL = 1 + accepted / drafts.
`vllm:request_success_total{finished_reason=...}` counts the finished requests: the stages compare its growth
during a measurement with the number of requests they sent (check_finished). Only the standard library is used.
"""

import re
import time

from specdec_pipeline.errors import PipelineError

PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"
_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """Yield (name, labels dict, float value) for every sample line of Prometheus text."""
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise PipelineError(f"metrics line {n}: not a Prometheus sample ({line[:80]!r}).")
        try:
            value = float(m.group("value"))
        except ValueError:
            raise PipelineError(f"metrics line {n}: value {m.group('value')!r} is not a number.") from None
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        yield m.group("name"), labels, value


def _base(name):
    if name.endswith("_created"):
        return None
    return name[: -len("_total")] if name.endswith("_total") else name


def spec_decode(text):
    """Return {"num_drafts", "num_draft_tokens", "num_accepted_tokens": float, "per_pos": {pos: float},
    "present": bool} - present is False when the server exported no spec-decode counter (no draft)."""
    out = {c: 0.0 for c in COUNTERS}
    per_pos, present = {}, False
    for name, labels, value in parse(text):
        base = _base(name)
        if not base or not base.startswith(PREFIX):
            continue
        key = base[len(PREFIX):]
        if key in COUNTERS:
            out[key] += value
            present = True
        elif key == PER_POS:
            pos = int(labels.get("position", "0"))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
            present = True
    out["per_pos"] = dict(sorted(per_pos.items()))
    out["present"] = present
    return out


def delta(after, before):
    """Counters of AFTER minus BEFORE (both from spec_decode)."""
    out = {c: after[c] - before[c] for c in COUNTERS}
    out["per_pos"] = {p: v - before["per_pos"].get(p, 0.0) for p, v in after["per_pos"].items()}
    out["present"] = after["present"]
    return out


def add(one, other):
    """The sum of two delta counter sets (batches of one measurement)."""
    out = {c: one[c] + other[c] for c in COUNTERS}
    out["per_pos"] = {p: one["per_pos"].get(p, 0.0) + other["per_pos"].get(p, 0.0)
                      for p in sorted(set(one["per_pos"]) | set(other["per_pos"]))}
    out["present"] = one["present"] or other["present"]
    return out


REQUESTS = "vllm:request_success"


def finished_requests(text, who="the server"):
    """Sum of vllm:request_success over its label sets (stop, length, abort, error, ...)."""
    total, present = 0.0, False
    for name, _labels, value in parse(text):
        if _base(name) == REQUESTS:
            total += value
            present = True
    if not present:
        raise PipelineError(f"{who} exported no {REQUESTS}_total counter on /metrics; cannot check that it served "
                            "only our requests (do not pass --disable-log-stats in the server arguments).")
    return int(total)


def check_finished(fetch, before, sent, who, settle_s=5.0):
    """Raise one line unless the counter FETCH() returns grew by exactly SENT since BEFORE. The counter may lag
    the last answer a little: a smaller count is read again for up to SETTLE_S seconds."""
    deadline = time.monotonic() + settle_s
    while True:
        counted = fetch() - before
        if counted >= sent or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if counted != sent:
        raise PipelineError(f"{who} counted {counted} finished requests while this stage sent {sent}; another "
                            "client used the server (or a request was lost) - run it again with nothing else "
                            "using the server.")
    return counted


def summarise(counts):
    """AL, acceptance rate and per-position acceptance rates from (delta) counters."""
    drafts = counts["num_drafts"]
    draft_tokens = counts["num_draft_tokens"]
    accepted = counts["num_accepted_tokens"]
    return {
        "drafts": int(drafts), "draft_tokens": int(draft_tokens), "accepted_tokens": int(accepted),
        "acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "per_position": [round(v / drafts, 4) if drafts else None for _p, v in sorted(counts["per_pos"].items())],
    }
