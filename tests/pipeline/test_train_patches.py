"""The training-side patches (t01-t03 of patch_sets/speculators_0_3_0.yml) on the real speculators 0.3.0 wheel,
against the mini-Kimi: Kimi-K2.5's layout (a `kimi_k25` wrapper config whose text_config is DeepSeek-V3 and whose
class is the checkpoint's own code, named by auto_map; tensors under `language_model.`), as transformers 4.57 meets
it.

The wheel's files are laid out in throwaway trees (conftest.speculators_tree), patched there by the collection's own
patch engine: with none of the patches, with t01, with t01 and t02, and with all three. Each patch's own failure
shows once the patches before it are in place: unpatched, the draft cannot read the verifier's config (transformers
4.57 has no `kimi_k25`: only the checkpoint's code reads it); with t01 it reads it but finds none of the verifier's
tensors; with t01 and t02 it loads them but computes its training targets from the pre-norm hidden state, not the
verifier's logits; with t03 the targets are the verifier's own logits.

Run with the pipeline venv: .cache/venvs/pipeline/bin/python -m pytest tests/pipeline/test_train_patches.py
"""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

WANTED = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
DRAFT_VOCAB = 16


@pytest.fixture(scope="module")
def kimi_tensors(mini_kimi):
    return load_file(str(mini_kimi / "model.safetensors"))


def _loader(site, tag):
    """speculators/utils/loading.py of the given tree as its own module (imports only torch, hf_hub, safetensors)."""
    spec = importlib.util.spec_from_file_location(f"loading_{tag}", site / "speculators" / "utils" / "loading.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_model_layers


def _single_file(path, tensors):
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _sharded(path, tensors):
    """Two shards plus model.safetensors.index.json (the real checkpoint's form, with 64 shards), split so that each
    shard holds some requested tensor."""
    path.mkdir()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(path / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.mark.parametrize("layout", [_single_file, _sharded], ids=["single-file", "sharded"])
def test_t02_loader_finds_the_mini_kimis_tensors_under_language_model(speculators_site, kimi_tensors, tmp_path, layout):
    ckpt = layout(tmp_path / "mini-kimi", kimi_tensors)
    got = _loader(speculators_site("t01", "t02", "t03"), "patched")(list(WANTED), str(ckpt))
    assert sorted(got) == sorted(WANTED)
    for name in WANTED:
        assert torch.equal(got[name], kimi_tensors["language_model." + name])


def test_unpatched_loader_fails_on_the_mini_kimis_index(speculators_site, kimi_tensors, tmp_path):
    ckpt = _sharded(tmp_path / "mini-kimi", kimi_tensors)
    with pytest.raises(ValueError, match="None of the requested tensor names were found"):
        _loader(speculators_site(), "unpatched")(list(WANTED), str(ckpt))


def test_unpatched_loader_returns_nothing_for_the_mini_kimis_single_file(speculators_site, mini_kimi):
    assert _loader(speculators_site(), "unpatched")(list(WANTED), str(mini_kimi)) == {}


@pytest.mark.parametrize("layout", [_single_file, _sharded], ids=["single-file", "sharded"])
def test_t02_loader_prefers_exact_names_and_refuses_to_guess(speculators_site, kimi_tensors, tmp_path, layout):
    # an exact model.norm.weight wins over the prefixed one; two candidates for lm_head.weight -> not loaded
    extra = {"model.norm.weight": torch.full((8,), 7.0), "mtp.lm_head.weight": torch.zeros(32, 8)}
    ckpt = layout(tmp_path / "ambiguous", {**kimi_tensors, **extra})
    got = _loader(speculators_site("t01", "t02", "t03"), "patched")(list(WANTED), str(ckpt))
    assert torch.equal(got["model.norm.weight"], extra["model.norm.weight"])
    assert torch.equal(got["model.embed_tokens.weight"], kimi_tensors["language_model.model.embed_tokens.weight"])
    assert "lm_head.weight" not in got


def test_t02_loader_keeps_plain_checkpoints_working(speculators_site, tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(32, 8, generator=gen),
               "lm_head.weight": torch.randn(32, 8, generator=gen), "model.norm.weight": torch.randn(8, generator=gen)}
    ckpt = _sharded(tmp_path / "plain", tensors)
    for tag, site in (("unpatched", speculators_site()), ("patched", speculators_site("t01", "t02", "t03"))):
        got = _loader(site, tag)(list(WANTED), str(ckpt))
        assert sorted(got) == sorted(WANTED)
        assert all(torch.equal(got[n], tensors[n]) for n in WANTED)


# Builds speculators' Eagle3DraftModel for the verifier, as the train step does, and runs its training forward (one
# TTT step) on the verifier's captured (pre-norm) last hidden state: the targets are what verifier_lm_head returns
# there (0.3.0 applies it to the hidden state as is; t03 puts the verifier's final norm first). Once per value of
# SPECDEC_TRUST_REMOTE_CODE in argv[7] (a JSON list; null: unset), in one process (the patched code reads the switch
# at each call). Prints "RESULT " and a JSON list, one {"has_norm", "eps", ...} or {"error": ...} per value. The
# draft layer's own rms_norm_eps (1e-6) is not the verifier's.
BUILD = r"""
import json, os, sys, torch
verifier, vocab, hidden, draft_vocab, hidden_file, out_file, switches = sys.argv[1:8]
vocab, hidden, draft_vocab = int(vocab), int(hidden), int(draft_vocab)

def attempt(out_file):
    from transformers import LlamaConfig
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    import speculators
    torch.manual_seed(0)
    layer = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=2,
                        num_key_value_heads=2, num_hidden_layers=1, rms_norm_eps=1e-6, head_dim=hidden // 2)
    layer._attn_implementation = "simple_flex_attention"  # the draft's attention (its forward runs on the CPU)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:draft_vocab] = True
    d2t = torch.zeros(draft_vocab, dtype=torch.long)
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab, norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            verifier=VerifierConfig(name_or_path=verifier, architectures=["KimiK25ForConditionalGeneration"])))
    model = Eagle3DraftModel(config=cfg, t2d=t2d, d2t=d2t).eval()
    h = torch.load(hidden_file)
    norm = getattr(model, "verifier_norm", None)
    seen = []  # the trainer's own targets: what verifier_lm_head returns inside forward (one TTT step)
    hook = model.verifier_lm_head.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
    with torch.no_grad():
        n = h.shape[0]
        model(hidden_states=torch.randn(1, n, 3 * hidden), input_ids=torch.zeros(1, n, dtype=torch.long),
              verifier_last_hidden_states=h[None], ttt_steps=1)
    hook.remove()
    targets = seen[0][0]
    torch.save({"targets": targets, "lm_head": model.verifier_lm_head.weight.detach(),
                "norm_weight": None if norm is None else norm.weight.detach()}, out_file)
    return {"file": speculators.__file__, "has_norm": norm is not None,
            "eps": None if norm is None else norm.variance_epsilon}

results = []
for value in json.loads(switches):
    os.environ.pop("SPECDEC_TRUST_REMOTE_CODE", None)
    if value is not None:
        os.environ["SPECDEC_TRUST_REMOTE_CODE"] = value
    try:
        results.append(attempt(out_file))
    except Exception as exc:
        results.append({"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"})
    results[-1]["remote_code_ran"] = any(m.startswith("transformers_modules") for m in sys.modules)
print("\nRESULT " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def verifier_forward(mini_kimi, tmp_path_factory):
    """The mini-Kimi's own forward (float32, through its auto_map code): the last layer's output before the final
    norm (the hidden state extraction stores) and the logits, for 24 tokens; the hidden state saved for BUILD."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model = AutoModelForCausalLM.from_pretrained(str(mini_kimi), trust_remote_code=True, dtype=torch.float32).eval()
    seen = {}
    hook = model.language_model.model.norm.register_forward_pre_hook(lambda _m, args: seen.update(h=args[0][0]))
    ids = torch.randint(0, model.config.text_config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0]
    hook.remove()
    path = tmp_path_factory.mktemp("verifier-forward") / "h.pt"
    torch.save(seen["h"].clone(), path)
    tc = model.config.text_config
    return {"hidden_file": path, "logits": logits, "vocab": tc.vocab_size, "hidden": tc.hidden_size,
            "eps": tc.rms_norm_eps}


def _build(site, verifier, forward, out_file, switches=("1",)):
    """BUILD with the speculators tree SITE first on the path; its results, one per switch value."""
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TORCHDYNAMO_DISABLE": "1",
           "HF_HOME": str(out_file.parent / "hf")}
    proc = subprocess.run([sys.executable, "-c", BUILD, str(verifier), str(forward["vocab"]), str(forward["hidden"]),
                           str(DRAFT_VOCAB), str(forward["hidden_file"]), str(out_file), json.dumps(list(switches))],
                          capture_output=True, text=True, env=env, check=False, timeout=300, stdin=subprocess.DEVNULL)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    results = json.loads(lines[-1].removeprefix("RESULT "))
    return results[0] if len(switches) == 1 else results


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_patched_draft_trains_against_the_mini_kimis_own_logits(speculators_site, mini_kimi, kimi_tensors,
                                                                verifier_forward, tmp_path):
    site = speculators_site("t01", "t02", "t03")
    out = _build(site, mini_kimi, verifier_forward, tmp_path / "out.pt")
    assert "error" not in out, out
    assert out["file"].startswith(str(site))
    got = torch.load(tmp_path / "out.pt")
    # t01: the verifier's sizes and eps from text_config (read through the checkpoint's code); t02: the prefixed norm
    # and lm head; t03: the verifier's final norm, so the targets are the verifier's logits (its draft-vocab rows)
    assert out["has_norm"] and out["eps"] == pytest.approx(verifier_forward["eps"])
    assert torch.equal(got["norm_weight"], kimi_tensors["language_model.model.norm.weight"].float())
    assert torch.equal(got["lm_head"], kimi_tensors["language_model.lm_head.weight"][:DRAFT_VOCAB].float())
    assert _rel(got["targets"], verifier_forward["logits"][:, :DRAFT_VOCAB]) < 1e-4


def test_unpatched_draft_cannot_read_the_mini_kimis_config(speculators_site, mini_kimi, verifier_forward, tmp_path):
    # 0.3.0 reads the verifier config without trust_remote_code: transformers 4.57 knows no kimi_k25 (t01's reason)
    out = _build(speculators_site(), mini_kimi, verifier_forward, tmp_path / "out.pt")
    assert "contains custom code which must be executed" in out.get("error", ""), out
    assert not out["remote_code_ran"]


def test_with_t01_alone_the_draft_finds_none_of_the_verifiers_tensors(speculators_site, mini_kimi, verifier_forward,
                                                                      tmp_path):
    # the config is read (t01), but 0.3.0 looks the tensors up by their unprefixed names (t02's reason)
    out = _build(speculators_site("t01"), mini_kimi, verifier_forward, tmp_path / "out.pt")
    assert out.get("error") == "KeyError: 'model.embed_tokens.weight'", out
    assert out["remote_code_ran"]


def test_without_t03_the_targets_are_not_the_verifiers_logits(speculators_site, mini_kimi, verifier_forward, tmp_path):
    # the tensors load (t01, t02), but 0.3.0 applies the lm head to the pre-norm hidden state (t03's reason)
    out = _build(speculators_site("t01", "t02"), mini_kimi, verifier_forward, tmp_path / "out.pt")
    assert "error" not in out and not out["has_norm"], out
    assert _rel(torch.load(tmp_path / "out.pt")["targets"], verifier_forward["logits"][:, :DRAFT_VOCAB]) > 0.5


def test_patched_draft_runs_the_checkpoints_code_only_with_the_switch_on(speculators_site, mini_kimi,
                                                                         verifier_forward, tmp_path):
    # t01 reads SPECDEC_TRUST_REMOTE_CODE (the pipeline's eagle3_pipeline_trust_remote_code); unset means off, and
    # off the mini-Kimi (like Kimi-K2.5 under transformers 4.57) cannot be read at all: its code does not run. A
    # value other than 0 or 1 is refused in one line.
    unset, off, bad = _build(speculators_site("t01", "t02", "t03"), mini_kimi, verifier_forward, tmp_path / "out.pt",
                             switches=(None, "0", "yes"))
    for out in (unset, off):
        assert "contains custom code which must be executed" in out.get("error", ""), out
        assert "trust_remote_code=True" in out["error"] and not out["remote_code_ran"]
    assert bad.get("error") == ("ValueError: SPECDEC_TRUST_REMOTE_CODE is 'yes'; expected 1 (run the model's own "
                                "code: trust_remote_code) or 0 (do not)"), bad
    assert not bad["remote_code_ran"]
