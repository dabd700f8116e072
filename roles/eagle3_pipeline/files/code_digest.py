"""Print the sha256 of the code the eagle3_pipeline role ships (run on the controller by a pipe lookup).

argv[1]: the role's files directory. Covers every file of specdec_pipeline (bytecode caches left out), the tiny
dataset and the requirements file: their relative paths and contents, in a fixed order.
"""
import hashlib
import os
import sys

root = sys.argv[1]
paths = ["tiny_conversations.jsonl", "requirements-pipeline.txt"]
for base, dirs, files in os.walk(os.path.join(root, "specdec_pipeline")):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    paths += [os.path.relpath(os.path.join(base, f), root) for f in files if not f.endswith(".pyc")]
digest = hashlib.sha256()
for rel in sorted(paths):
    with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    digest.update(f"{rel}\0{len(data)}\0".encode() + data)
print(digest.hexdigest())
