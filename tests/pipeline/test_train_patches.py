"""The training-side patches (t01-t03 of patch_sets/speculators_0_3_0.yml) on the real speculators 0.3.0 wheel.

The wheel's files are laid out in a throwaway tree, patched there by the collection's own patch engine (the venv's
installed speculators is never touched), and the real loading.py of both trees is run on tiny safetensors
checkpoints whose tensors sit under a wrapper prefix the way Kimi-K2.5 stores them (``language_model.``).

Run with the pipeline venv: .cache/venvs/pipeline/bin/python -m pytest tests/pipeline/test_train_patches.py
"""

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
sys.path.insert(0, str(ROOT))

from ansible_collections.specdec.eagle3.plugins.module_utils.ast_probe import SourceTree  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.patch_engine import run as patch_run  # noqa: E402
from ansible_collections.specdec.eagle3.plugins.module_utils.pyenv import inspect  # noqa: E402
from tests.support.upstream import fetch  # noqa: E402

TRAIN_PATCHES = [p for p in yaml.safe_load((ROOT / "patch_sets" / "speculators_0_3_0.yml").read_text())["patches"]
                 if p["id"].startswith("t")]
WANTED = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]


def _runner(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """{'unpatched': site, 'patched': site}: the real 0.3.0 wheel extracted twice into throwaway venvs."""
    out = {}
    for name in ("unpatched", "patched"):
        venv = tmp_path_factory.mktemp(name) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        with zipfile.ZipFile(fetch("speculators", "0.3.0", "wheel")) as whl:
            whl.extractall(site)
        if name == "patched":
            python = str(venv / "bin" / "python")
            env = inspect(python, {"speculators"}, {"speculators"}, _runner)
            result = patch_run(TRAIN_PATCHES, env, SourceTree(env.roots), "present")
            assert "failed" not in result, result.get("msg")
            assert sorted(r["id"] for r in result["results"] if r["state"] == "applied") == \
                sorted(p["id"] for p in TRAIN_PATCHES)
        out[name] = site
    return out


def _loader(site, tag):
    """speculators/utils/loading.py of the given tree as its own module (imports only torch, hf_hub, safetensors)."""
    spec = importlib.util.spec_from_file_location(f"loading_{tag}", site / "speculators" / "utils" / "loading.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_model_layers


def _tensors(prefix, extra=None):
    gen = torch.Generator().manual_seed(0)
    out = {f"{prefix}model.embed_tokens.weight": torch.randn(32, 8, generator=gen),
           f"{prefix}lm_head.weight": torch.randn(32, 8, generator=gen),
           f"{prefix}model.norm.weight": torch.randn(8, generator=gen),
           "vision_tower.patch_embed.weight": torch.randn(4, 4, generator=gen)}
    out.update(extra or {})
    return out


def _single_file(path, tensors):
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _sharded(path, tensors):
    """Two shards plus model.safetensors.index.json, split so each shard holds some requested tensor."""
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
def test_patched_loader_finds_prefixed_verifier_tensors(trees, tmp_path, layout):
    tensors = _tensors("language_model.")
    ckpt = layout(tmp_path / "kimi-like", tensors)
    got = _loader(trees["patched"], "patched")(list(WANTED), str(ckpt))
    assert sorted(got) == sorted(WANTED)
    for name in WANTED:
        assert torch.equal(got[name], tensors["language_model." + name])


def test_unpatched_loader_fails_on_prefixed_index(trees, tmp_path):
    ckpt = _sharded(tmp_path / "kimi-like", _tensors("language_model."))
    with pytest.raises(ValueError, match="None of the requested tensor names were found"):
        _loader(trees["unpatched"], "unpatched")(list(WANTED), str(ckpt))


def test_unpatched_loader_returns_nothing_for_prefixed_single_file(trees, tmp_path):
    ckpt = _single_file(tmp_path / "kimi-like", _tensors("language_model."))
    assert _loader(trees["unpatched"], "unpatched")(list(WANTED), str(ckpt)) == {}


@pytest.mark.parametrize("layout", [_single_file, _sharded], ids=["single-file", "sharded"])
def test_patched_loader_prefers_exact_names_and_refuses_to_guess(trees, tmp_path, layout):
    # an exact model.norm.weight wins over a prefixed one; two candidates for lm_head.weight -> not loaded
    extra = {"model.norm.weight": torch.full((8,), 7.0), "mtp.lm_head.weight": torch.zeros(32, 8)}
    tensors = _tensors("language_model.", extra)
    ckpt = layout(tmp_path / "ambiguous", tensors)
    got = _loader(trees["patched"], "patched")(list(WANTED), str(ckpt))
    assert torch.equal(got["model.norm.weight"], extra["model.norm.weight"])
    assert torch.equal(got["model.embed_tokens.weight"], tensors["language_model.model.embed_tokens.weight"])
    assert "lm_head.weight" not in got


def test_patched_loader_keeps_plain_checkpoints_working(trees, tmp_path):
    tensors = _tensors("")
    ckpt = _sharded(tmp_path / "plain", tensors)
    for tag in ("unpatched", "patched"):
        got = _loader(trees[tag], tag)(list(WANTED), str(ckpt))
        assert sorted(got) == sorted(WANTED)
        assert all(torch.equal(got[n], tensors[n]) for n in WANTED)


BUILD = r"""
import json, sys, torch
from transformers import LlamaConfig
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
import speculators
verifier, vocab, draft_vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
layer = LlamaConfig(vocab_size=vocab, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                    num_key_value_heads=2, num_hidden_layers=1, rms_norm_eps=1e-5, head_dim=4)
t2d = torch.zeros(vocab, dtype=torch.bool)
t2d[:draft_vocab] = True
d2t = torch.zeros(draft_vocab, dtype=torch.long)
cfg = Eagle3SpeculatorConfig(
    transformer_layer_config=layer, draft_vocab_size=draft_vocab, norm_before_residual=True,
    speculators_config=SpeculatorsConfig(
        algorithm="eagle3", default_proposal_method="greedy",
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
        verifier=VerifierConfig(name_or_path=verifier, architectures=["LlavaForConditionalGeneration"])))
model = Eagle3DraftModel(config=cfg, t2d=t2d, d2t=d2t)
h = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    normed = model.verifier_norm(h)
print(json.dumps({"file": speculators.__file__, "norm_weight": model.verifier_norm.weight.tolist(),
                  "eps": model.verifier_norm.variance_epsilon, "h": h.tolist(), "normed": normed.tolist(),
                  "lm_head": model.verifier_lm_head.weight.tolist()}))
"""


def _build(site, verifier, vocab=32, draft_vocab=16, **extra_env):
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TORCHDYNAMO_DISABLE": "1",
           **extra_env}
    return subprocess.run([sys.executable, "-c", BUILD, str(verifier), str(vocab), str(draft_vocab)],
                          capture_output=True, text=True, env=env, check=False, timeout=300)


@pytest.fixture(scope="module")
def wrapped_verifier(tmp_path_factory):
    """A Kimi-like wrapper: a multimodal config whose decoder sizes sit in text_config (transformers' own Llava),
    weights under language_model.; rms_norm_eps only in text_config."""
    from transformers import LlamaConfig, LlavaConfig  # noqa: PLC0415

    path = tmp_path_factory.mktemp("wrapped") / "verifier"
    text = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                       num_key_value_heads=2, num_hidden_layers=2, rms_norm_eps=1e-3)
    LlavaConfig(text_config=text).save_pretrained(path)
    tensors = _tensors("language_model.")
    save_file(tensors, str(path / "model.safetensors"))
    return path, tensors


def test_patched_draft_model_builds_on_a_wrapped_verifier(trees, wrapped_verifier):
    path, tensors = wrapped_verifier
    proc = _build(trees["patched"], path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(trees["patched"]))
    # t01: eps from text_config; t02: the prefixed norm and lm head; t03: the verifier norm exists and is RMSNorm
    assert out["eps"] == pytest.approx(1e-3)
    assert torch.equal(torch.tensor(out["norm_weight"]), tensors["language_model.model.norm.weight"])
    assert torch.equal(torch.tensor(out["lm_head"]), tensors["language_model.lm_head.weight"][:16])
    h = torch.tensor(out["h"])
    expected = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-3) * tensors["language_model.model.norm.weight"]
    assert torch.allclose(torch.tensor(out["normed"]), expected, atol=1e-5)


def test_unpatched_draft_model_fails_on_the_wrapped_verifier(trees, wrapped_verifier):
    path, _unused = wrapped_verifier
    proc = _build(trees["unpatched"], path)
    assert proc.returncode != 0
    # 0.3.0 reads the sizes at the top level of the wrapper's config
    assert "'LlavaConfig' object has no attribute 'hidden_size'" in proc.stderr, proc.stderr[-3000:]


@pytest.fixture
def verifier_with_code(tmp_path, wrapped_verifier):
    """The wrapped verifier whose config class is its own code (auto_map, as Kimi-K2.5's); the code notes each run."""
    path, _unused = wrapped_verifier
    dest = tmp_path / "verifier-with-code"
    shutil.copytree(path, dest)
    marker = tmp_path / "ran.txt"
    (dest / "configuration_marker.py").write_text(
        "from transformers import LlavaConfig\n\n"
        f"with open({str(marker)!r}, 'a') as out:\n    out.write('configuration_marker.py\\n')\n\n\n"
        "class MarkerLlavaConfig(LlavaConfig):\n    pass\n")
    conf = json.loads((dest / "config.json").read_text())
    conf["auto_map"] = {"AutoConfig": "configuration_marker.MarkerLlavaConfig"}
    (dest / "config.json").write_text(json.dumps(conf))
    return dest, marker


@pytest.mark.parametrize("value,runs", [(None, False), ("0", False), ("1", True)], ids=["unset", "off", "on"])
def test_patched_verifier_config_honours_the_switch(trees, verifier_with_code, tmp_path, value, runs):
    # t01 reads SPECDEC_TRUST_REMOTE_CODE (the pipeline's eagle3_pipeline_trust_remote_code); unset means off
    path, marker = verifier_with_code
    extra = {} if value is None else {"SPECDEC_TRUST_REMOTE_CODE": value}
    proc = _build(trees["patched"], path, HF_HOME=str(tmp_path / "hf"), **extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists() is runs
    assert json.loads(proc.stdout.strip().splitlines()[-1])["eps"] == pytest.approx(1e-3)  # text_config either way


def test_patched_verifier_config_refuses_an_unknown_switch_value(trees, verifier_with_code, tmp_path):
    path, marker = verifier_with_code
    proc = _build(trees["patched"], path, HF_HOME=str(tmp_path / "hf"), SPECDEC_TRUST_REMOTE_CODE="yes")
    assert proc.returncode != 0 and not marker.exists()
    assert ("ValueError: SPECDEC_TRUST_REMOTE_CODE is 'yes'; expected 1 (run the model's own code: "
            "trust_remote_code) or 0 (do not)") in proc.stderr, proc.stderr[-3000:]
