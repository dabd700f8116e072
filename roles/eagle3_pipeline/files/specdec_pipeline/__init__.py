"""specdec_pipeline: the EAGLE-3 draft pipeline of specdec.eagle3 (regenerate, prepare, extract, vocab, train,
export).

One module per step; each step writes a manifest (see manifest.py) and is skipped when it matches.
"""

STEPS = ("regenerate", "prepare", "extract", "vocab", "train", "export")
__version__ = "1.0.0"
