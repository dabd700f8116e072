"""The rule for a user's extra arguments to a vLLM server the collection starts - its one home.

OWNED_ARGS are set by the collection itself: where the server listens (loopback only, a free port) and its key (a
fresh one per server). A user's value would expose the server (--host 0.0.0.0) or replace the key, so `owned_arg`
finds one in a list of arguments, as vLLM reads them: unique abbreviations, '_' for '-', '=value' or a separate
value. TRUST_ARG is a stage's own switch (the target's code runs); only that switch adds it.

This file imports nothing of the package and only the standard library: serve.py, vllm_server.py and evaluate.py
use it on the host, and the validate play loads it on the controller (plugins/action/inventory_check.py) before
anything is installed.
"""

OWNED_ARGS = ("--host", "--port", "--uds", "--api-key")
TRUST_ARG = "--trust-remote-code"


def owned_arg(args, owned_args=OWNED_ARGS):
    """The first of ARGS that sets one of OWNED_ARGS (e.g. '--host=0.0.0.0' or the abbreviation '--ho'), or None."""
    for arg in map(str, args or []):
        if not arg.startswith("--") or len(arg) < 4:
            continue
        name = arg.split("=", 1)[0].replace("_", "-")
        if any(owned.startswith(name) for owned in owned_args):
            return arg
    return None
