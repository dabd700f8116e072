"""Command line: python -m specdec_pipeline CONFIG.json run [--until STEP] | status | plan | build-tiny DATASET OUT

`run` executes the steps in order, skipping each whose manifest matches; it prints one JSON line (the summary
the Ansible role shows) and exits 0, 3 when it stopped on purpose (e.g. no training possible), 2 on bad input.
"""

import argparse
import json
import sys

from specdec_pipeline import STEPS, config, manifest, report
from specdec_pipeline.errors import PipelineError, StopAfter
from specdec_pipeline.fsutil import write_json
from specdec_pipeline.progress import log, setup_logging


def _step_module(step):
    import importlib  # noqa: PLC0415

    return importlib.import_module(f"specdec_pipeline.{step}")


def run(cfg, until=None):
    ran, skipped, stopped = [], [], ""
    write_json(config.run_path(cfg, "progress.json"), {"step": "checking manifests", "state": "running", "done": 0,
                                                       "total": len(STEPS), "unit": "steps"})
    for step in STEPS:
        current, why = manifest.is_current(cfg, step)
        if current:
            skipped.append(step)
            log.info("%s: up to date (manifest matches) - skipped", step)
        else:
            log.info("%s: running (%s)", step, why)
            try:
                _step_module(step).run(cfg)
            except StopAfter as exc:
                stopped = str(exc)
                break
            ran.append(step)
        if step == until:
            break
    report_path = report.write(cfg, stopped)
    return {"changed": bool(ran), "ran": ran, "skipped": skipped, "stopped": stopped,
            "report": str(report_path), "run_dir": cfg["run_dir"], "export": str(config.run_path(cfg, "export"))
            if "export" in ran + skipped else ""}


def plan(cfg):
    """{step: why a run would run it, or "" when it would be skipped}. Writes nothing (check mode uses it)."""
    out, first_stale = {}, ""
    for step in STEPS:
        current, why = manifest.is_current(cfg, step)
        if first_stale:
            out[step] = why if not current else f"after {first_stale}"
        else:
            out[step] = "" if current else why
            first_stale = "" if current else step
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="specdec_pipeline")
    parser.add_argument("config", help="run configuration JSON (or the dataset for build-tiny)")
    parser.add_argument("command", choices=["run", "status", "plan", "build-tiny"])
    parser.add_argument("--until", choices=STEPS)
    parser.add_argument("--out", help="build-tiny: output directory")
    args = parser.parse_args(argv)
    if args.command == "build-tiny":
        from specdec_pipeline import tiny  # noqa: PLC0415

        return tiny.main([args.config, args.out])
    try:
        cfg = config.load(args.config)
        if args.command == "plan":
            print(json.dumps(plan(cfg)))
            return 0
        setup_logging(config.run_path(cfg, "logs", "pipeline.log"))
        if args.command == "status":
            print(json.dumps({s: manifest.is_current(cfg, s)[0] for s in STEPS}))
            return 0
        summary = run(cfg, args.until)
    except PipelineError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    write_json(config.run_path(cfg, "summary.json"), summary)
    print(json.dumps(summary))
    return 3 if summary["stopped"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
