"""The mini-Kimi's own model code: the files specdec_pipeline.mini_kimi copies into the checkpoint, beside
config.json, whose auto_map names them (as Kimi-K2.5's config.json names the code its checkpoint ships).

Written for specdec.eagle3; not the checkpoint's code. The builder imports them from here as well (transformers 4).
"""
