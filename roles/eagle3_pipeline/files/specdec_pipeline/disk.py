"""The disk estimate of the hidden states - one rule for the extract step's check before it writes (both tracks),
`validate`, the disk-full message and the role's preflight (target_check.py):

    size   = tokens x the track's bytes per token (tracks/<track>/rules.py extract_bytes_per_token: capture ids x
             hidden x the stored value's bytes, plus what the track's file format adds per token)
    needed = size x extract.disk_margin                    (what a check demands free: needed)
    named  = size x max(extract.disk_margin, 1)            (what a disk-full message names: estimate)

A check refuses when the filesystem has less than `needed` free (what the step already wrote, or removes before it
writes, counted as done). extract.disk_margin is the run configuration's (config.DEFAULTS: 1.1; the role does not
change it); below 1 it lowers what the checks demand (0 turns them off), never what a disk-full message names. The tokens are the
prepared samples' when they are there, else planned_tokens: max_samples, or the local .jsonl dataset's
conversations less the held-out ones, at seq_length tokens each.
"""

from specdec_pipeline.fsutil import check_space, human

WORK_DIR_FIX = "point eagle3_pipeline_work_dir at a larger filesystem or lower eagle3_pipeline_max_samples"


def margin(cfg):
    """extract.disk_margin: the free space a check demands, as a multiple of the size."""
    return float(cfg["extract"]["disk_margin"])


def size(cfg, track, tokens, n_layers, hidden):
    """Bytes the hidden states of TOKENS tokens take on TRACK (N_LAYERS capture ids, HIDDEN values each)."""
    return int(tokens) * track.extract_bytes_per_token(cfg, n_layers, hidden)


def needed(cfg, nbytes):
    """The free space a check demands for NBYTES of hidden states."""
    return int(nbytes * margin(cfg))


def estimate(cfg, nbytes):
    """What a disk-full message names for NBYTES of hidden states: the margin's share, never less than NBYTES."""
    return int(nbytes * max(margin(cfg), 1.0))


def space_needed(cfg, track):
    """What the whole extraction writes on TRACK, as a disk-full message names it: every prepared token's hidden
    states at the track's capture ids and the target's hidden size."""
    from specdec_pipeline.prepare import load_samples  # noqa: PLC0415 - the step's own input, read when asked
    from specdec_pipeline.target import text_config  # noqa: PLC0415

    tokens = sum(len(s["input_ids"]) for s in load_samples(cfg))
    return estimate(cfg, size(cfg, track, tokens, len(track.layer_ids(cfg)), int(text_config(cfg).hidden_size)))


def fix(track):
    """What to do when the space is short: the track's own way first (e.g. a smaller storage), then the work dir."""
    return f"{track.DISK_FIX + ', ' if track.DISK_FIX else ''}{WORK_DIR_FIX}"


def _what(cfg, track, tokens, n_layers, hidden):
    per_token = track.extract_bytes_per_token(cfg, n_layers, hidden)
    return (per_token, f"{per_token} B/token on the {track.NAME} track: {n_layers} capture ids x hidden {hidden} as "
                       f"{track.storage_name(cfg)}; margin {margin(cfg):g}")


def preflight(cfg, track, out_dir, tokens, n_layers, hidden, detail="", fix_text=None, reclaim=0):
    """One PipelineError before anything is written when the filesystem of OUT_DIR cannot hold the hidden states of
    the TOKENS still to extract (RECLAIM: bytes the step removes first); returns the bytes per token."""
    per_token, what = _what(cfg, track, tokens, n_layers, hidden)
    check_space("extract", out_dir, needed(cfg, tokens * per_token), f"{tokens} tokens x {what}{detail}",
                fix_text or f"free space there, {fix(track)}", reclaim=reclaim)
    return per_token


def planned_tokens(cfg, conversations=None):
    """(tokens, how they were counted) the extraction will hold before prepare ran: max_samples, else CONVERSATIONS
    (the lines of a local .jsonl dataset; None when not known) less the held-out ones, at seq_length tokens each;
    (None, "") when that cannot be told (a hub dataset without max_samples)."""
    seq = int(cfg["seq_length"])
    if cfg["dataset"]["max_samples"]:
        n = int(cfg["dataset"]["max_samples"])
        return n * seq, f"{n} samples (max_samples) x at most {seq} tokens"
    if conversations is not None and str(cfg["dataset"]["source"]).endswith(".jsonl"):
        n = max(int(conversations) - int(cfg["dataset"]["heldout"]), 0)
        return n * seq, f"{n} conversations of {str(cfg['dataset']['source']).rsplit('/', 1)[-1]} x at most {seq} tokens"
    return None, ""


def problem(cfg, track, tokens, counted, n_layers, hidden, free, have=0):
    """'' when FREE bytes hold the hidden states of TOKENS (COUNTED says how they were counted; HAVE bytes of them
    already extracted), else the one-line problem naming the work directory."""
    if not tokens:
        return ""
    per_token, what = _what(cfg, track, tokens, n_layers, hidden)
    need = needed(cfg, tokens * per_token)
    if need - have <= free:
        return ""
    return (f"extract: the work directory's filesystem ({cfg['run_dir']}) has {human(free)} free but the planned "
            f"extraction needs about {human(need - have)} ({counted}, {what}"
            f"{f'; less {human(have)} already extracted' if have else ''}); {fix(track)}.")
