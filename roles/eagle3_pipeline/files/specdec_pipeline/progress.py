"""Progress JSON (polled by the Ansible role while a step runs) and the log file."""

import logging
import sys
import time
from pathlib import Path

from specdec_pipeline.fsutil import write_json

log = logging.getLogger("specdec_pipeline")


def setup_logging(log_file=None):
    # A log line that cannot be written (e.g. a full disk) is dropped, not printed as a traceback; the failing
    # step reports the full disk itself.
    logging.raiseExceptions = False
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        handlers=handlers, force=True)


class Progress:
    """Writes <run_dir>/progress.json: step, done/total, tokens/s, ETA; at most every `interval` seconds."""

    def __init__(self, path, step, total, unit="samples", interval=1.0):
        self.path = Path(path)
        self.step = step
        self.total = total
        self.unit = unit
        self.interval = interval
        self.start = time.monotonic()
        self.last = 0.0
        self.done = 0
        self.tokens = 0
        self.base_done = 0
        self.first = None  # (time, done) when the first unit was counted: the ETA's rate runs from there

    def resume_from(self, done):
        self.done = self.base_done = done

    def update(self, done=None, tokens=0, force=False, state="running", message=""):
        if done is not None:
            self.done = done
        self.tokens += tokens
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-6)
        if self.first is None and self.done > self.base_done:
            self.first = (now, self.done)
        # The ETA counts from the first unit done, not from the start: what comes before it (a server's start,
        # compilation) is not the pace of the rest (regenerate on the GPU began with "ETA 17h16m" and took 2 min).
        eta = None
        if self.first and self.done > self.first[1] and now > self.first[0]:
            eta = max(self.total - self.done, 0) * (now - self.first[0]) / (self.done - self.first[1])
        write_json(self.path, {
            "step": self.step, "state": state, "done": self.done, "total": self.total, "unit": self.unit,
            "tokens_per_s": round(self.tokens / elapsed, 1), "elapsed_s": round(elapsed, 1),
            "eta_s": None if eta is None else round(eta, 1), "message": message, "updated": time.time(),
        })
        # tokens/s only for a step that counts tokens (training counts epochs: "0.0 tokens/s" would mislead)
        log.info("%s: %s/%s %s%s%s", self.step, self.done, self.total, self.unit,
                 f", {self.tokens / elapsed:.1f} tokens/s" if self.tokens else "",
                 "" if eta is None else f", ETA {eta:.0f}s")

    def finish(self, message=""):
        self.update(force=True, state="finished", message=message)
