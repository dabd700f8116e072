"""The run's one chat mode (chat_mode: thinking | instant), rendered through the target's own chat template.

A template either has a switch (Kimi-K2.5: `thinking`; Qwen3-style: `enable_thinking`) - found by rendering a
probe prompt with the switch on and off and comparing - or renders one mode only: thinking when its generation
prompt ends in the opening reasoning tag, instant otherwise. regenerate, prepare (rendering and loss masks) and
the held-out prompts the evaluate stage serves all render through `render`, so they cannot disagree.

In thinking mode an assistant reply is "reasoning</think>content": `split_reasoning` separates the two, stored as
the message's reasoning_content and content (the field Kimi's template reads). Templates show reasoning only on
the turns after the last user turn; `for_training` keeps it on the last assistant turn alone, so every prefix of
the conversation renders as a prefix of the whole.
"""

from specdec_pipeline.errors import PipelineError

MODES = ("thinking", "instant")
SWITCHES = ("thinking", "enable_thinking")  # the template variables known to switch the mode
OPEN, CLOSE = "<think>", "</think>"
PROBE = [{"role": "user", "content": "Hello"}]
_FOUND = {}


def _apply(tok, messages, add_generation_prompt, kwargs):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)


def template_modes(tok):
    """(switch, modes): the template variable that switches the mode (None when it has none) and the modes the
    template renders."""
    key = (id(tok), getattr(tok, "chat_template", None))
    if key not in _FOUND:
        found = None
        for name in SWITCHES:
            if _apply(tok, PROBE, True, {name: True}) != _apply(tok, PROBE, True, {name: False}):
                found = (name, MODES)
                break
        if found is None:
            plain = _apply(tok, PROBE, True, {}).rstrip()
            found = (None, ("thinking",) if plain.endswith(OPEN) else ("instant",))
        _FOUND[key] = found
    return _FOUND[key]


def problem(mode, tok, target):
    """'' when MODE is a chat mode the template of TOK renders, else the one-line problem."""
    if mode not in MODES:
        return f"chat_mode is {mode!r}; expected one of {list(MODES)} (eagle3_pipeline_chat_mode)."
    switch, modes = template_modes(tok)
    if mode not in modes:
        return (f"chat_mode {mode!r}: the chat template of {target} renders {modes[0]} mode only (it reads none of "
                f"the switches {', '.join(SWITCHES)}); set eagle3_pipeline_chat_mode: {modes[0]}.")
    return ""


def check(cfg, tok):
    """PipelineError naming the setting when CFG's chat_mode is not one the target's template renders."""
    said = problem(cfg.get("chat_mode"), tok, cfg["target"]["path"])
    if said:
        raise PipelineError(said)


def render(tok, messages, mode=None, add_generation_prompt=False):
    """MESSAGES rendered by the template in MODE (None: the template's own default, no switch passed)."""
    switch = template_modes(tok)[0] if mode else None
    kwargs = {switch: mode == "thinking"} if switch else {}
    return _apply(tok, messages, add_generation_prompt, kwargs)


def prompt_ids(tok, messages, mode):
    """The token ids of MESSAGES rendered in chat MODE with the generation prompt: what regenerate sends for the next
    reply and what the evaluate stage sends for a prompt given as messages."""
    return tok.encode(render(tok, messages, mode, add_generation_prompt=True), add_special_tokens=False)


def split_reasoning(text, mode):
    """(reasoning, content) of a generated reply. In thinking mode the prompt ended in the opening tag, so the
    reply is reasoning, the closing tag, then the content; a reply without the closing tag has no content."""
    if mode != "thinking":
        return "", text.strip()
    reasoning, closed, content = text.partition(CLOSE)
    if not closed:
        return reasoning.strip(), ""
    return reasoning.strip(), content.strip()


def for_training(messages, mode):
    """MESSAGES as prepare renders them: reasoning_content only on the last assistant turn and only in thinking
    mode (the template shows history turns without it)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("reasoning_content") and (mode != "thinking" or i != last):
            del m["reasoning_content"]
        out.append(m)
    return out
