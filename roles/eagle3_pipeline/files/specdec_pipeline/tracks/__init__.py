"""The seam between the tracks: a static registry of track name -> track package, and the loader of a run
configuration (every part of it that depends on the track is declared by the track).

A track is one package below tracks/ (tracks/patched/, tracks/current/) whose __init__ declares, without
importing anything heavy (tracks.API; both shipped tracks keep the declarations in rules.py, which their step
modules import):
- NAME: the track's name, as in specdec_track;
- SETTINGS: its own sections/keys of the run configuration with their defaults ({} for none), added to the shared
  ones by load; check_settings(cfg, where): their check (one PipelineError);
- STEP_KEYS: the config keys each step's hash covers on this track beyond config.STEP_KEYS;
- STEPS: {step: a function returning the module that implements it}, for every step of specdec_pipeline.STEPS;
  the shared steps (regenerate, prepare, vocab) come from specdec_pipeline.steps, the track's own from its
  package. Each step module has run(cfg), and optionally check(cfg) (its settings check, reads only: cli runs
  every one before it touches the run directory, so a refused setting leaves every file as it was) and
  space_needed(cfg) (the bytes the step writes, named when the disk fills up);
- default_layer_ids(n), layer_ids_problem(ids, n) and layer_ids(cfg): the track's capture-id rule;
- extract_bytes_per_token(cfg, n_layers, hidden), storage_name(cfg) and DISK_FIX: what the disk estimate
  (disk.py) needs of the track - bytes per token, the storage's name, the track's own way to need less.
A track that trains other draft algorithms than EAGLE-3 (algorithms.py) also declares DRAFT_STEP_KEYS (the keys of
their train-<algo> and export-<algo> steps beyond config.DRAFT_STEP_KEYS); its train and export modules then take
the algorithm (run(cfg, algo=...)), bound by DraftStep. A track without refuses such drafts in check_settings.

Only the running track's step modules are imported (the functions in STEPS import them when called). Nothing
below this package imports it: config.py holds the shared settings and this module the loader, so the step
modules' imports of config form no circle. Adding a track: one package here and one entry in TRACKS, plus its
Ansible files (docs/tracks.md).
"""

import functools

from specdec_pipeline import STEPS, algorithms, config, vllm_server
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.tracks import current, patched

TRACKS = {"patched": patched, "current": current}
DEFAULT = "patched"
# What every track package declares (tests/unit/test_track_registry.py checks each one against it).
API = ("NAME", "SETTINGS", "check_settings", "STEPS", "STEP_KEYS", "default_layer_ids", "layer_ids_problem",
       "layer_ids", "extract_bytes_per_token", "storage_name", "DISK_FIX")


def defaults():
    """The run configuration's defaults: the shared settings, the managed server's and every track's own (the role
    renders every section on every track; each part checks its own)."""
    out = config.DEFAULTS
    for part in (vllm_server.SETTINGS, *(track.SETTINGS for track in TRACKS.values())):
        out = config.combine(out, part)
    return out


def from_raw(raw, where):
    """The run configuration RAW (a dict read from WHERE) with its defaults, checked: the shared settings, the
    track's name, the managed server's settings and every track's own. One PipelineError names the first problem."""
    cfg = config.merge(defaults(), raw, where)
    config.check(cfg, where)
    cfg["track"] = DEFAULT if cfg["track"] is None else cfg["track"]
    if cfg["track"] not in TRACKS:
        raise PipelineError(f"{where}: track is {cfg['track']!r}; expected one of {sorted(TRACKS)} "
                            "(specdec_track in the inventory).")
    vllm_server.check_settings(cfg, where)
    for track in TRACKS.values():
        track.check_settings(cfg, where)
    cfg["_path"] = where
    track = TRACKS[cfg["track"]]
    # A track that trains other algorithms than EAGLE-3 declares the keys of their steps (DRAFT_STEP_KEYS); one
    # without refuses them in its check_settings.
    cfg["_step_keys"] = config.step_keys(track.STEP_KEYS, algorithms.others(cfg), getattr(track, "DRAFT_STEP_KEYS", {}))
    return cfg


def load(path):
    """The run configuration in the JSON file PATH (the one loader: cli, the trainer process, validate)."""
    return from_raw(config.read_config_file(path, config.MISSING), str(path))


def of(cfg):
    """The track package CFG runs (load has checked the name)."""
    return TRACKS[cfg["track"]]


class DraftStep:
    """A step of an algorithm other than EAGLE-3 (train-<algo>, export-<algo>): the track's module of the base step
    (train, export) with the algorithm given to its run, check and space_needed."""

    def __init__(self, module, algo):
        self.run = functools.partial(module.run, algo=algo)
        for name in ("check", "space_needed"):
            if hasattr(module, name):
                setattr(self, name, functools.partial(getattr(module, name), algo=algo))


def steps(cfg):
    """The steps CFG runs, in order (algorithms.steps): the shared ones, then each other algorithm's own."""
    return algorithms.steps(cfg, STEPS)


def step_module(cfg, step):
    """The module implementing STEP on CFG's track (imported now); a step of another algorithm than EAGLE-3 is its
    base step's module bound to that algorithm (DraftStep)."""
    base, algo = algorithms.split(step)
    module = of(cfg).STEPS[base]()
    return module if algo in (None, "eagle3") else DraftStep(module, algo)


def runner(cfg, step):
    return step_module(cfg, step).run


def checker(cfg, step):
    """The settings check of STEP on CFG's track, or None."""
    return getattr(step_module(cfg, step), "check", None)


def checks(cfg, until=None):
    """The settings checks of every step up to UNTIL (all when None) on CFG's track, in step order."""
    out = []
    for step in steps(cfg):
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
