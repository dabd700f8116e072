"""The current track's consumer of hidden-states files (tracks/current/backends/server.py): a file is read once
(hash and validation from the same bytes), renamed only when valid, and the files are taken by a pool of threads
while the requests stay in flight - a write the connector still holds (its flock) does not hold up the others.

The files here are written in the connector's layout (safetensors: token_ids, hidden_states as bf16 or as
float8_e4m3fn with one float32 scale per token) and locked the way the connector locks them (flock on
<file>.lock, held by another process); tests/current runs the same code against vLLM's CPU build.
"""

import hashlib
import queue
import random
import re
import subprocess
import sys
import threading

import pytest
import torch
from safetensors.torch import save_file

from specdec_pipeline.errors import PipelineError
from specdec_pipeline.tracks.current.backends import server

N_LAYERS, HIDDEN = 3, 64


def hidden_file(path, input_ids, storage, seed=0, damage=None):
    """A hidden-states file for INPUT_IDS in the connector's layout; DAMAGE(tensors) may spoil it first."""
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(len(input_ids), N_LAYERS, HIDDEN, generator=g)
    tensors = {"token_ids": torch.tensor(input_ids, dtype=torch.int64)}
    if storage == "fp8":
        scale = (hs.abs().amax(dim=(1, 2), keepdim=True) / 448.0).clamp(min=1e-12)
        tensors["hidden_states"], tensors[server.SCALES_KEY] = (hs / scale).to(torch.float8_e4m3fn), scale
    else:
        tensors["hidden_states"] = hs.to(torch.bfloat16)
    if damage:
        damage(tensors)
    save_file(tensors, str(path))
    return path


def reference(tensors, input_ids, storage):
    """What the check finds, computed from the dequantized values (the check as it was before it read bit patterns)."""
    hs = tensors["hidden_states"]
    stored = str(hs.dtype).removeprefix("torch.")
    if server.SCALES_KEY in tensors:
        hs = hs.to(torch.float32) * tensors[server.SCALES_KEY].to(torch.float32)
    if tensors["token_ids"].tolist() != list(input_ids):
        return "token_ids"
    if tuple(hs.shape) != (len(input_ids), N_LAYERS, HIDDEN):
        return "shape"
    if stored != ("float8_e4m3fn" if storage == "fp8" else "bfloat16"):
        return "dtype"
    if not torch.isfinite(hs).all():
        return "NaN or Inf"
    zero = hs.float().norm(dim=-1) == 0
    if zero.any():
        return f"zero {int(zero.any(dim=1).sum())} {sorted({int(c) for c in zero.nonzero()[:, 1]})}"
    return None


def found(tensors, input_ids, storage):
    try:
        server.check_tensors(tensors, input_ids, N_LAYERS, HIDDEN, storage, "f")
    except ValueError as exc:
        msg = str(exc)
        zero = re.search(r"all zero in (\d+) of \d+ tokens \(captured layer positions (\[.*\])\)", msg)
        if zero:
            return f"zero {zero.group(1)} {zero.group(2)}"
        return next(k for k in ("token_ids", "shape", "dtype", "NaN or Inf") if k in msg)
    return None


@pytest.mark.parametrize("storage", ["fp8", "bf16"])
def test_the_check_from_bit_patterns_finds_what_the_dequantized_values_show(tmp_path, storage):
    rng = random.Random(0)
    ids = list(range(5, 45))
    seen = set()
    for case in range(240):
        path = hidden_file(tmp_path / "f.safetensors", ids, storage, seed=case)
        from safetensors.torch import load_file  # noqa: PLC0415

        tensors = load_file(str(path))
        hs, kind = tensors["hidden_states"], case % 8
        tok, layer, col = rng.randrange(len(ids)), rng.randrange(N_LAYERS), rng.randrange(HIDDEN)
        if kind == 1:
            hs[tok, layer] = 0
        elif kind == 2:
            hs[tok] = 0
        elif kind == 3 and storage == "fp8":
            hs.view(torch.uint8)[tok, layer, col] = rng.choice([0x7F, 0xFF])  # the two NaNs of float8_e4m3fn
        elif kind == 3:
            hs[tok, layer, col] = rng.choice([float("inf"), float("-inf"), float("nan")])
        elif kind == 4 and storage == "fp8":
            tensors[server.SCALES_KEY][tok] = rng.choice([0.0, float("nan"), float("inf"), 1e36])  # 1e36: overflows
        elif kind == 5 and storage == "fp8":
            hs.view(torch.uint8)[tok, layer] = 0x80  # negative zeros
        elif kind == 5:
            hs[tok, layer] = -0.0
        elif kind == 6:
            tensors["token_ids"][tok] += 1
        want = reference(tensors, ids, storage)
        assert found(tensors, ids, storage) == want, (case, want)
        seen.add(want.split()[0] if want else None)
    assert seen >= {None, "zero", "NaN", "token_ids"}


@pytest.mark.parametrize("storage", ["fp8", "bf16"])
def test_a_file_is_hashed_and_validated_from_one_read_then_renamed(tmp_path, storage):
    staging, dest = tmp_path / "staging", tmp_path / "hidden_states" / "hs_0.safetensors"
    staging.mkdir()
    dest.parent.mkdir()
    staged = hidden_file(staging / "req-0.safetensors", [3, 4, 5], storage)
    (staging / "req-0.safetensors.lock").touch()  # the connector's lock file, released
    data = staged.read_bytes()
    got = server.take_file(str(staged), staging, dest, [3, 4, 5], N_LAYERS, HIDDEN, storage)
    assert (got["size"], got["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert dest.read_bytes() == data
    assert sorted(p.name for p in staging.iterdir()) == []  # renamed; the lock file removed


def test_a_damaged_file_is_refused_and_not_moved(tmp_path):
    staging, dest = tmp_path / "staging", tmp_path / "hs_0.safetensors"
    staging.mkdir()

    def zero_row(tensors):
        tensors["hidden_states"][1, 2] = 0

    staged = hidden_file(staging / "req-0.safetensors", [3, 4, 5], "fp8", damage=zero_row)
    with pytest.raises(ValueError, match=r"all zero in 1 of 3 tokens \(captured layer positions \[2\]\)"):
        server.take_file(str(staged), staging, dest, [3, 4, 5], N_LAYERS, HIDDEN, "fp8")
    (staging / "req-1.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1")
    with pytest.raises(ValueError, match="req-1.safetensors: not a safetensors file"):
        server.take_file(str(staging / "req-1.safetensors"), staging, dest, [3, 4, 5], N_LAYERS, HIDDEN, "fp8")
    assert staged.exists() and not dest.exists()


# Holds the connector's lock on argv[1] (flock LOCK_EX, as its writer does) until stdin closes.
LOCK_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_files_are_taken_by_several_threads_while_a_write_still_holds_its_lock(tmp_path):
    staging, out = tmp_path / "staging", tmp_path / "hidden_states"
    staging.mkdir()
    out.mkdir()
    todo = [{"id": i, "input_ids": [10 + i, 11 + i]} for i in range(4)]
    for s in todo:
        hidden_file(staging / f"req-{s['id']}.safetensors", s["input_ids"], "fp8", seed=s["id"])
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(staging / "req-0.safetensors.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        first_take = threading.Event()
        threads = {}

        def ask(sample):  # sample 0 is answered first; its write is still locked when the others are answered
            if sample["id"]:
                assert first_take.wait(30)
            return str(staging / f"req-{sample['id']}.safetensors")

        def take(sample, path):
            threads[sample["id"]] = threading.current_thread().name
            if sample["id"] == 0:
                first_take.set()
            return server.take_file(path, staging, out / f"hs_{sample['id']}.safetensors", sample["input_ids"],
                                    N_LAYERS, HIDDEN, "fp8")

        got = queue.Queue()

        def consume():
            try:
                for batch in server.pipelined(todo, ask, take, concurrency=4, n_takers=2):
                    for sample, rec in batch:
                        got.put((sample["id"], rec))
            except BaseException as exc:  # noqa: BLE001 - the test thread reports it
                got.put(("error", exc))

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        early = dict(got.get(timeout=60) for dummy in range(3))
        if "error" in early:
            raise early["error"]
        assert sorted(early) == [1, 2, 3], early  # taken while sample 0's write still held its lock
        assert holder.poll() is None and (staging / "req-0.safetensors").exists()
        assert len(set(threads.values())) >= 2, threads  # not one consumer: a second taker did them
    finally:
        holder.stdin.close()  # the write is done: the lock is released
        holder.wait(timeout=30)
    last = got.get(timeout=60)
    consumer.join(timeout=30)
    assert last[0] == 0, last
    for i, rec in [*early.items(), last]:
        data = (out / f"hs_{i}.safetensors").read_bytes()
        assert (rec["size"], rec["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert list(staging.iterdir()) == []


def test_a_failed_take_ends_the_iteration_with_its_own_error_after_the_finished_ones():
    todo = [{"id": i} for i in range(6)]

    def take(sample, answer):
        if sample["id"] == 3:
            raise PipelineError("extract: the server's file for sample 3 is not valid (damaged); see the server log.")
        return answer

    handed = []
    with pytest.raises(PipelineError, match="^extract: the server's file for sample 3 is not valid") as err:
        for batch in server.pipelined(todo, lambda s: s["id"] * 10, take, concurrency=1, n_takers=1):
            handed += [(s["id"], r) for s, r in batch]
    assert "\n" not in str(err.value)
    assert all(r == i * 10 for i, r in handed) and 3 not in dict(handed)
