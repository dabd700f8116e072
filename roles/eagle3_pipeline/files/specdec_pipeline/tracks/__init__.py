"""The seam between the two tracks: which function runs a step.

Each track module maps step names to callables taking the run configuration (its HOOKS); a step a track
does not list runs the shared step module (specdec_pipeline.<step>.run). The steps, manifests, progress file
and report are the same on both tracks.
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
