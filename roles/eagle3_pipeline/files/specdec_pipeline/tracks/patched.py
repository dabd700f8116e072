"""The patched track: speculators 0.3.x patched at source level, vLLM 0.16-era, in-process extraction.

Every step is the shared step module (extract picks the transformers or the patched vLLM backend itself).
"""

HOOKS = {}
