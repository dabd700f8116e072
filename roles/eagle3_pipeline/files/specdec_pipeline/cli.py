"""Command line: python -m specdec_pipeline CONFIG.json run [--until STEP] | status | plan | validate
| build-tiny DATASET OUT

`run` executes the steps in order, skipping each whose manifest matches; it prints one JSON line (the summary
the Ansible role shows) and exits 0, 3 when it stopped on purpose (e.g. no training possible), 2 on bad input.
`validate` reads only: every step's settings and the target checks (validate.py), one `ERROR: ` line per problem
on stderr, a JSON line on stdout, exit 2 when there is a problem.
"""

import argparse
import json
import os
import sys

from specdec_pipeline import STEPS, algorithms, config, manifest, remote_code, report, tracks, validate
from specdec_pipeline.errors import PipelineError, StopAfter, unexpected_error_line
from specdec_pipeline.fsutil import disk_full_error, is_disk_full, recover_swap, write_json
from specdec_pipeline.progress import log, setup_logging


def run_step(cfg, step):
    """Run STEP; a full disk anywhere inside it becomes one PipelineError naming the step, path, need and free."""
    try:
        return tracks.runner(cfg, step)(cfg)
    except (PipelineError, StopAfter):
        raise
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        log.debug("%s: disk full", step, exc_info=True)
        path = getattr(exc, "filename", None) or config.run_path(cfg, step)
        raise disk_full_error(step, path, tracks.space_needed(cfg, step)) from None


def check_settings(cfg, until=None):
    """Every step's settings (up to UNTIL) and, where a step can tell from what is there, its disk space -
    checked before the run writes anything: reads only."""
    for check in tracks.checks(cfg, until):
        check(cfg)


def run(cfg, until=None):
    ran, skipped, stopped = [], [], ""
    steps = tracks.steps(cfg)  # the shared steps, then each other draft algorithm's train and export
    remote_code.announce(cfg, log)  # before anything loads the target: which of its files will run
    for step in steps:  # finish or undo a directory swap a kill interrupted
        recover_swap(config.run_path(cfg, step))
    check_settings(cfg, until)  # a refused setting (or too little disk space) leaves every file as it was
    write_json(config.run_path(cfg, "progress.json"), {"step": "checking manifests", "state": "running", "done": 0,
                                                       "total": len(steps), "unit": "steps"})
    for step in steps:
        current, why = manifest.is_current(cfg, step)
        if current:
            skipped.append(step)
            log.info("%s: up to date (manifest matches) - skipped", step)
            manifest.add_remote_code(cfg, step)
        else:
            log.info("%s: running (%s)", step, why)
            try:
                run_step(cfg, step)
            except StopAfter as exc:
                stopped = str(exc)
                break
            ran.append(step)
        if step == until:
            break
    try:
        report_path = report.write(cfg, stopped)
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise disk_full_error("report", config.run_path(cfg, "report")) from None
    done = ran + skipped
    exports = {algo: str(config.run_path(cfg, algorithms.step_name("export", algo))) for algo in algorithms.chosen(cfg)
               if algorithms.step_name("export", algo) in done}
    return {"changed": bool(ran), "ran": ran, "skipped": skipped, "stopped": stopped,
            "report": str(report_path), "run_dir": cfg["run_dir"], "export": exports.get("eagle3", ""),
            "exports": exports}


def plan(cfg):
    """{step: why a run would run it, or "" when it would be skipped}. Writes nothing (check mode uses it)."""
    out, first_stale = {}, ""
    for step in tracks.steps(cfg):
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
    parser.add_argument("command", choices=["run", "status", "plan", "validate", "build-tiny"])
    parser.add_argument("--until", choices=[*STEPS, *(algorithms.step_name(base, algo) for algo in algorithms.ALGORITHMS
                                                      if algo != "eagle3" for base in algorithms.TRAIN_STEPS)])
    parser.add_argument("--out", help="build-tiny: output directory")
    parser.add_argument("--shape", default="", help="build-tiny: e.g. heads=2,kv_heads=1 (head size 32)")
    args = parser.parse_args(argv)
    # Nothing of the target comes from the hub: every model load of this process and of the processes it starts
    # (trainer, vLLM) is offline. A hub dataset is fetched by a child process of its own (datasets_io).
    os.environ.update(remote_code.OFFLINE_ENV)
    if args.command == "build-tiny":
        from specdec_pipeline import tiny  # noqa: PLC0415

        return tiny.main([args.config, args.out], args.shape)
    try:
        cfg = tracks.load(args.config)
        if args.command == "plan":
            print(json.dumps(plan(cfg)))
            return 0
        if args.command == "validate":
            return validate.main(cfg, sys.stdout, sys.stderr)
        setup_logging(config.run_path(cfg, "logs", "pipeline.log"))
        if args.command == "status":
            print(json.dumps({s: manifest.is_current(cfg, s)[0] for s in tracks.steps(cfg)}))
            return 0
        if args.until and args.until not in tracks.steps(cfg):
            raise PipelineError(f"--until {args.until}: not a step of this run (its steps: {tracks.steps(cfg)}); "
                                "its algorithms are drafts in the run configuration (eagle3_pipeline_draft_algorithms).")
        summary = run(cfg, args.until)
        write_json(config.run_path(cfg, "summary.json"), summary)
    except PipelineError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug or an unforeseen failure: the traceback goes to the log file, one line here
        print(unexpected_error_line(exc, lambda: config.run_path(tracks.load(args.config), "logs", "pipeline.log")),
              file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 3 if summary["stopped"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
