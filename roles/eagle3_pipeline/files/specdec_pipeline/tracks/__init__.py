"""The seam between the tracks: a static registry of track name -> track package.

A track is one package below tracks/ (tracks/patched/, tracks/current/) whose __init__ declares, without
importing anything heavy:
- STEPS: {step: a function returning the module that implements it}, for every step of specdec_pipeline.STEPS;
  the shared steps (prepare, vocab) come from specdec_pipeline.steps, the track's own from its package. Each step
  module has run(cfg), and optionally check(cfg) (its settings check, reads only: cli runs every one before it
  touches the run directory, so a refused setting leaves every file as it was) and space_needed(cfg) (the bytes
  the step writes, named when the disk fills up);
- STEP_KEYS: the config keys each step's hash covers on this track beyond config.STEP_KEYS;
- default_layer_ids(n), layer_ids_problem(ids, n) and layer_ids(cfg): the track's capture-id rule;
- extract_bytes_per_token(cfg, n_layers, hidden): the track's disk estimate for the hidden states.

Only the running track's step modules are imported (the functions in STEPS import them when called). Adding a
track: one package here and one entry in TRACKS (docs/tracks.md).
"""

from specdec_pipeline import STEPS
from specdec_pipeline.tracks import current, patched

TRACKS = {"patched": patched, "current": current}
DEFAULT = "patched"
# What every track package declares (tests/unit/test_track_registry.py checks each one against it).
API = ("NAME", "STEPS", "STEP_KEYS", "default_layer_ids", "layer_ids_problem", "layer_ids", "extract_bytes_per_token")


def of(cfg):
    """The track package CFG runs (config.load has checked the name)."""
    return TRACKS[cfg.get("track", DEFAULT)]


def step_module(cfg, step):
    """The module implementing STEP on CFG's track (imported now)."""
    return of(cfg).STEPS[step]()


def runner(cfg, step):
    return step_module(cfg, step).run


def checker(cfg, step):
    """The settings check of STEP on CFG's track, or None."""
    return getattr(step_module(cfg, step), "check", None)


def checks(cfg, until=None):
    """The settings checks of every step up to UNTIL (all when None) on CFG's track, in step order."""
    out = []
    for step in STEPS:
        check = checker(cfg, step)
        if check is not None:
            out.append(check)
        if step == until:
            break
    return out


def space_needed(cfg, step):
    """Bytes STEP writes on CFG's track (for a disk-full message), or None when it cannot tell."""
    estimate = getattr(step_module(cfg, step), "space_needed", None)
    try:
        return estimate(cfg) if estimate is not None else None
    except Exception:  # noqa: BLE001 - only an estimate for the message
        return None
