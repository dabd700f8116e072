"""Nothing lost, nothing accepted half-written: bad settings after a finished extraction, damaged samples,
damaged run files, full disks and byte-for-byte reproducible outputs."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import FILES, pipeline, write_config


@pytest.fixture
def tmpfs(tmp_path):
    """mount_tmpfs(path, size) -> path, or None where no tmpfs can be mounted (not root); unmounted afterwards."""
    mounted = []

    def mount(path, size):
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            mount.why = proc.stderr.strip() or f"mount exited {proc.returncode}"
            return None
        mounted.append(path)
        return path

    mount.why = ""
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def need_tmpfs(tmpfs, path, size):
    got = tmpfs(path, size)
    if got is None:
        pytest.skip(f"a small tmpfs cannot be mounted here ({tmpfs.why}); the full-disk tests need root")
    return got


def digests(directory):
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def copy_run(full_run, tmp_path, **over):
    run_dir = tmp_path / "run"
    shutil.copytree(full_run["run_dir"], run_dir)
    return run_dir, write_config(tmp_path / "run.json", run_dir, full_run["target"], **over)


def error_lines(proc):
    return [x for x in proc.stderr.splitlines() if x.startswith("ERROR:")]


def test_bad_layer_ids_after_a_finished_extraction_keep_every_sample(full_run, tmp_path):
    run_dir, cfg = copy_run(full_run, tmp_path, extract={"layer_ids": [2, 300]})
    before = digests(run_dir / "extract")
    assert sum(1 for k in before if k.startswith("data_") and k.endswith(".pt")) == 24
    proc = pipeline(cfg, "run", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = error_lines(proc)
    assert len(err) == 1 and "layer_ids [2, 300]" in err[0] and "0..7" in err[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert digests(run_dir / "extract") == before, "finished samples were deleted or changed"
    assert not (run_dir / "extract.new").exists()


def test_new_layer_ids_build_beside_the_finished_extraction_and_swap_in(full_run, tmp_path):
    run_dir, cfg = copy_run(full_run, tmp_path, extract={"layer_ids": [1, 3, 7]})
    proc = pipeline(cfg, "run", "--until", "extract")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ran"] == ["extract"]
    assert json.loads((run_dir / "extract" / "data_config.json").read_text())["layer_ids"] == [1, 3, 7]
    assert not (run_dir / "extract.new").exists() and not (run_dir / "extract.old").exists()
    man = json.loads((run_dir / "manifests" / "extract.json").read_text())
    for rel, meta in man["outputs"].items():
        assert hashlib.sha256((run_dir / rel).read_bytes()).hexdigest() == meta["sha256"], rel


def test_truncated_sample_is_redone_byte_identical(full_run, tmp_path):
    run_dir, cfg = copy_run(full_run, tmp_path)
    victim = run_dir / "extract" / "data_5.pt"
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])
    flipped = run_dir / "extract" / "data_7.pt"  # same size, other bytes
    raw = bytearray(flipped.read_bytes())
    raw[-100] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    proc = pipeline(cfg, "run")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ran"] == ["extract"], summary  # redone with the same bytes: later steps are really current
    assert victim.read_bytes() == good
    assert flipped.read_bytes() == (full_run["run_dir"] / "extract" / "data_7.pt").read_bytes()
    assert "data_5.pt is redone" in proc.stderr and "data_7.pt is redone" in proc.stderr
    rows = [json.loads(x) for x in (run_dir / "extract" / "finished.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(24))


def test_unreadable_sample_is_redone(full_run, tmp_path):
    run_dir, cfg = copy_run(full_run, tmp_path)
    victim = run_dir / "extract" / "data_3.pt"
    victim.unlink()
    victim.symlink_to("data_3.pt.gone")  # a dangling link: opening it fails
    proc = pipeline(cfg, "run", "--until", "extract")
    assert "data_3.pt is redone" in proc.stderr
    assert victim.read_bytes() == (full_run["run_dir"] / "extract" / "data_3.pt").read_bytes()


@pytest.mark.parametrize("name", ["manifests/extract.json", "manifests/prepare.json", "extract/state.json"])
def test_invalid_json_run_file_is_one_clear_error(full_run, tmp_path, name):
    run_dir, cfg = copy_run(full_run, tmp_path)
    (run_dir / name).write_bytes(b'{"step": "extract", "outp\xff')
    if name == "extract/state.json":
        (run_dir / "manifests" / "extract.json").unlink()
    for command in ("run", "status"):
        proc = pipeline(cfg, command, check=False)
        if command == "status" and name == "extract/state.json":
            assert proc.returncode == 0  # status reads manifests only
            continue
        assert proc.returncode == 2, proc.stderr[-3000:]
        err = error_lines(proc)
        assert len(err) == 1 and str(run_dir / name) in err[0] and "not valid JSON" in err[0] and "delete" in err[0]
        assert "Traceback" not in proc.stderr and "JSONDecodeError" not in proc.stderr
    assert sum(1 for p in (run_dir / "extract").glob("data_*.pt")) == 24
    (run_dir / name).unlink()
    pipeline(cfg, "run")


def test_torn_last_line_of_finished_jsonl_is_recovered_on_the_first_rerun(full_run, tmp_path):
    run_dir, cfg = copy_run(full_run, tmp_path)
    finished = run_dir / "extract" / "finished.jsonl"
    lines = finished.read_text().splitlines()
    last = json.loads(lines[-1])
    # killed while appending the last record: its sample file is there, its line is torn
    finished.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    (run_dir / "manifests" / "extract.json").unlink()
    proc = pipeline(cfg, "run", "--until", "extract", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in finished.read_text().splitlines()]  # every line parses
    assert sorted(r["id"] for r in rows) == list(range(24))
    assert next(r for r in rows if r["id"] == last["id"]) == last  # redone, same bytes


def test_same_inputs_give_byte_identical_samples_and_export(full_run, tmp_path, tmpfs):
    """A second run from scratch (on another filesystem where one can be mounted, so another directory order)
    reproduces every sample file and the exported checkpoint byte for byte."""
    base = tmpfs(tmp_path / "fs", "64m") or tmp_path
    cfg = write_config(base / "run.json", base / "run", full_run["target"])
    pipeline(cfg, "run")
    first, second = full_run["run_dir"], base / "run"
    assert digests(first / "extract") == digests(second / "extract")
    assert digests(first / "export") == digests(second / "export")


def test_training_file_split_does_not_depend_on_directory_order(full_run, tmp_path, tmpfs):
    """tmpfs lists a directory in creation order: two copies made in opposite orders must train on the same split."""
    from specdec_pipeline import tracks
    from specdec_pipeline.tracks.patched.train_worker import loaders

    fs = tmpfs(tmp_path / "fs", "16m") or tmp_path
    src = sorted((full_run["run_dir"] / "extract").glob("data_*.pt"))
    splits = []
    for name, files in (("a", src), ("b", src[::-1])):
        (fs / name / "extract").mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, fs / name / "extract" / f.name)
        cfg = tracks.load(write_config(fs / f"{name}.json", fs / name, full_run["target"]))
        train, val = loaders(cfg, 1, 0)
        splits.append(([os.path.basename(x) for x in train.dataset.data],
                       [os.path.basename(x) for x in val.dataset.data]))
    assert splits[0] == splits[1]


def test_extract_checks_disk_space_before_writing_a_sample(full_run, tmp_path, tmpfs):
    fs = need_tmpfs(tmpfs, tmp_path / "fs", "1m")
    cfg = write_config(tmp_path / "run.json", fs / "run", full_run["target"])
    proc = pipeline(cfg, "run", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = error_lines(proc)
    assert len(err) == 1 and err[0].startswith(f"ERROR: extract: not enough disk space for {fs / 'run' / 'extract'}"), err
    assert "MiB" in err[0] and "KiB free" in err[0] and " GB" not in err[0]
    assert not (fs / "run" / "extract").exists()


def test_full_disk_during_extract_is_one_line_and_leaves_no_partial_file(full_run, tmp_path, tmpfs):
    fs = need_tmpfs(tmpfs, tmp_path / "fs", "1m")
    cfg = write_config(tmp_path / "run.json", fs / "run", full_run["target"], extract={"disk_margin": 0.0})
    proc = pipeline(cfg, "run", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = error_lines(proc)
    assert len(err) == 1 and err[0].startswith(f"ERROR: extract: the disk is full - writing {fs / 'run'}"), err
    assert "needs about " in err[0] and " MiB, " in err[0] and re.search(r"[0-9.]+ (B|KiB) free; ", err[0])
    assert "Traceback" not in proc.stderr
    out = fs / "run" / "extract"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    done = [json.loads(x)["id"] for x in (out / "finished.jsonl").read_text().splitlines()]
    assert done and len(done) < 24
    assert all((out / f"data_{i}.pt").stat().st_size > 0 for i in done)


def test_full_disk_in_the_trainer_process_is_one_line(full_run, tmp_path, tmpfs):
    from specdec_pipeline.tracks.patched.train import _run_trainer

    fs = need_tmpfs(tmpfs, tmp_path / "fs", "256k")
    run_dir, cfg = copy_run(full_run, tmp_path)
    env = dict(os.environ, PYTHONPATH=str(FILES), TORCH_COMPILE_DISABLE="1")
    status, said = _run_trainer([sys.executable, "-m", "specdec_pipeline.tracks.patched.train_worker", str(cfg), "cpu",
                                 str(fs / "train")], env)
    assert status == 28
    assert said.startswith(f"train: the disk is full - writing {fs / 'train' / 'checkpoints'}"), said
    assert re.search(r"[0-9.]+ (B|KiB) free; ", said), said


def test_train_and_export_check_disk_space_first(full_run, tmp_path, tmpfs):
    fs = need_tmpfs(tmpfs, tmp_path / "fs", "2600k")
    run_dir = fs / "run"
    shutil.copytree(full_run["run_dir"], run_dir, ignore=shutil.ignore_patterns("train", "export", "report", "logs"))
    (run_dir / "manifests" / "train.json").unlink()
    (run_dir / "manifests" / "export.json").unlink()
    cfg = write_config(tmp_path / "run.json", run_dir, full_run["target"])
    proc = pipeline(cfg, "run", check=False)
    err = error_lines(proc)
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith(f"ERROR: train: not enough disk space for {run_dir / 'train.new' / 'checkpoints'}")
    assert "KiB" in err[0] and "epoch checkpoints" in err[0]
    assert not (run_dir / "train.new" / "checkpoints").exists()

    # export: every earlier step is done, the export does not fit
    fs = need_tmpfs(tmpfs, tmp_path / "fs2", "4m")
    run_dir = fs / "run"
    shutil.copytree(full_run["run_dir"], run_dir, ignore=shutil.ignore_patterns("export", "report", "logs"))
    (run_dir / "manifests" / "export.json").unlink()
    cfg = write_config(tmp_path / "run.json", run_dir, full_run["target"])
    filler = fs / "filler"
    free = shutil.disk_usage(fs).free
    filler.write_bytes(b"\0" * max(free - (100 << 10), 0))
    proc = pipeline(cfg, "run", check=False)
    err = error_lines(proc)
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith(f"ERROR: export: not enough disk space for {run_dir / 'export'}"), err
    assert not (run_dir / "export").exists() and not (run_dir / "export.new").exists()
