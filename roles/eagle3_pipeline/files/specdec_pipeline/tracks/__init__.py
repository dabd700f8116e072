"""The seam between the two tracks: which function runs a step.

Each track module maps step names to callables taking the run configuration (its HOOKS); a step a track
does not list runs the shared step module (specdec_pipeline.<step>.run). The steps, manifests, progress file
and report are the same on both tracks.

A step's settings check (the track's CHECKS entry, else the shared step module's check()) reads only: cli.run
calls every one before it touches the run directory, so a refused setting leaves every file as it was.
"""

import importlib

TRACKS = ("patched", "current")


def module(cfg):
    return importlib.import_module(f"specdec_pipeline.tracks.{cfg.get('track', 'patched')}")


def runner(cfg, step):
    hook = module(cfg).HOOKS.get(step)
    if hook is not None:
        return hook
    return importlib.import_module(f"specdec_pipeline.{step}").run


def checker(cfg, step):
    """The settings check of STEP on CFG's track, or None: the track's CHECKS entry; for a step the track does
    not replace, the shared step module's check() when it has one."""
    mod = module(cfg)
    check = getattr(mod, "CHECKS", {}).get(step)
    if check is not None or step in mod.HOOKS:
        return check
    return getattr(importlib.import_module(f"specdec_pipeline.{step}"), "check", None)
