# Copyright: (c) 2026, specdec developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check, in the ML venv, that torch sees the expected GPUs at the expected compute capability.

Prints one JSON line with what torch sees, then either nothing more (exit 0) or one sentence (exit 1).
"""

import argparse
import json
import sys


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect-count", type=int, required=True)
    parser.add_argument("--expect-cc", required=True)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(f"torch cannot be imported in {sys.prefix} ({exc}); install the ML venv before the torch GPU check.")
        return 1
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    devices = []
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        devices.append({"index": i, "name": torch.cuda.get_device_name(i), "cc": f"{major}.{minor}"})
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "available": available,
                      "devices": devices}))
    if count != args.expect_count:
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {count} GPU(s) but {args.expect_count} are "
              "expected; check CUDA_VISIBLE_DEVICES and that the torch build's CUDA runs on the installed driver.")
        return 1
    wrong = [f"GPU {d['index']} at {d['cc']}" for d in devices if d["cc"] != args.expect_cc]
    if wrong:
        print(f"torch sees {', '.join(wrong)} where compute capability {args.expect_cc} is expected.")
        return 1
    arch = f"sm_{args.expect_cc.replace('.', '')}"
    archs = torch.cuda.get_arch_list()
    if count and arch not in archs and not any(a.startswith("compute_") for a in archs):
        print(f"torch {torch.__version__} has no kernels for {arch} (it has {', '.join(archs)}); install a torch build "
              "for this GPU's architecture.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
