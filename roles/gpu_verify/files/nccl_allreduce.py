# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""All-reduce across every GPU with torch.distributed (NCCL), one process per GPU, under a timeout.

A hang (reported for NCCL peer-to-peer on PCIe RTX PRO 6000 systems) ends in a clear sentence instead of a stuck run.
`--backend gloo --world-size N` runs the same collective on CPU processes.
Prints one JSON line with the result, then one sentence and exit 1 on failure.
"""

import argparse
import json
import os
import socket
import sys
import time


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank, world_size, backend, port, numel, queue):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        tensor = torch.full((numel,), float(rank + 1), device=device)
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if backend == "nccl":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        expected = world_size * (world_size + 1) / 2
        queue.put((rank, bool(torch.all(tensor == expected).item()), seconds, ""))
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent as one line
        queue.put((rank, False, 0.0, f"{type(exc).__name__}: {exc}".splitlines()[0]))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=0, help="processes (default: every visible GPU)")
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--numel", type=int, default=1 << 24)
    args = parser.parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    world_size = args.world_size or (torch.cuda.device_count() if args.backend == "nccl" else 2)
    if world_size < 1:
        print(json.dumps({"world_size": 0}))
        print("No GPU is visible to torch, so there is nothing to all-reduce across.")
        return 1
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, args.backend, port, args.numel, queue), daemon=True)
             for r in range(world_size)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + args.timeout
    results = {}
    while len(results) < world_size and time.monotonic() < deadline:
        try:
            rank, ok, seconds, error = queue.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            results[rank] = (ok, seconds, error)
            if error:  # the other ranks would wait for this one until the deadline
                break
        except Exception:  # queue.Empty: keep waiting until the deadline
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()) if len(results) == world_size else 0)
        if proc.is_alive():
            proc.kill()
    p2p = os.environ.get("NCCL_P2P_DISABLE", "")
    print(json.dumps({"world_size": world_size, "backend": args.backend, "NCCL_P2P_DISABLE": p2p,
                      "results": {str(k): v for k, v in sorted(results.items())}}))
    errors = sorted((rank, r[2]) for rank, r in results.items() if r[2])
    if errors:
        print(f"The {args.backend} all-reduce across {world_size} process(es) failed on rank {errors[0][0]}: {errors[0][1]}.")
        return 1
    if len(results) < world_size:
        missing = sorted(set(range(world_size)) - set(results))
        print(f"The {args.backend} all-reduce across {world_size} process(es) did not finish within {args.timeout:g} s "
              f"(rank {', '.join(map(str, missing))} silent, NCCL_P2P_DISABLE={p2p or 'unset'}); on PCIe systems set "
              "gpu_verify_nccl_p2p_disable to true and check IOMMU/ACS settings.")
        return 1
    failed = {rank: r for rank, r in results.items() if not r[0]}
    if failed:
        print(f"The {args.backend} all-reduce gave a wrong sum on rank {', '.join(map(str, sorted(failed)))}.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
