"""The token facts of the plan (plan.tokens), resolved once from the loaded tokenizer before the data scan: the pad,
bos and eos ids as the encoder actually adds them, and the tokens a target span may end on.

Everything that pads, adds a bos, stops generation or checks a turn's end reads them from the plan: the encoder,
the collators, the generated samples, preflight's terminator checks and the exports.
"""

from __future__ import annotations

from typing import Any

from seqtune.config.plan import Resolved, Tokens
from seqtune.config.schema import SPLITS, RootConfig
from seqtune.data.formats import formats_of
from seqtune.data.kinds import kind_of_format
from seqtune.data.tokenize import render_chat
from seqtune.models import spec_for
from seqtune.tokenizers.control import control_tokens
from seqtune.tokenizers.facts import added_bos_id, tokenizer_facts
from seqtune.tokenizers.templates import after_probe_reply, end_of_turn_probe


def token_facts(cfg: RootConfig, resolved: Resolved, tokenizer: Any) -> Tokens:
    formats = {source.format for split in SPLITS for source in cfg.data.sources(split)}
    has_template = bool(getattr(tokenizer, "chat_template", None))
    # Formats whose records the chat template renders (a preference pair or an unpaired example may hold message
    # lists): each source's own format.
    templated = any(fmt.templated for fmt in formats_of(formats)) and has_template
    # A kind whose records may hold message-list prompts (SampleKind.message_prompts) generates assistant turns:
    # they end at the template's turn closer. It is not a terminator of the run (a string prompt's completion is
    # no turn, and nothing of a prompt trains), so it stays a fact of its own that generation reads per prompt.
    message_prompts = has_template and any(kind_of_format(fmt).message_prompts for fmt in formats)
    eos = int(tokenizer.eos_token_id)
    pad = resolved.vocab.pad_id if resolved.vocab.pad_id is not None else eos
    return Tokens(
        pad_id=int(pad),
        bos_id=added_bos_id(tokenizer),
        eos_id=eos,
        terminators=terminators(tokenizer, spec_for(cfg.model).eot_token, templated=templated),
        templated=templated,
        turn_closer=template_turn_closer(tokenizer, control_tokens(tokenizer)) if message_prompts else None,
    )


def terminators(tokenizer: Any, eot: str | None, *, templated: bool) -> dict[int, str]:
    """The tokens a target span may end on, id -> text: eos, the model's end-of-turn `eot` (its family's, or what
    the checkpoint's template closes a turn with; when the tokenizer has it) and, for records the chat template
    renders, the token it closes an assistant turn with."""
    control = control_tokens(tokenizer)
    eos = int(tokenizer.eos_token_id)
    ends = {eos: control.get(eos, tokenizer.eos_token)}
    eot_id = tokenizer_facts(tokenizer, eot_token=eot).special_ids.get(eot) if eot else None
    if eot_id is not None:
        ends[int(eot_id)] = eot
    closer = template_turn_closer(tokenizer, control) if templated else None
    if closer is not None:
        ends[closer] = control[closer]
    return ends


def template_turn_closer(tokenizer: Any, control: dict[int, str]) -> int | None:
    """The first control token the chat template renders after an assistant reply, inside that reply's turn (the
    turn of a reply that is not the last, which templates close like every other); None when there is none."""
    try:
        text, spans = render_chat(tokenizer, end_of_turn_probe())
    except Exception:  # noqa: BLE001 - a template that cannot render this has no closer to find
        return None
    lo, hi = spans[0]
    after = after_probe_reply(text[lo:hi])
    if after is None:
        return None
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    return next((int(i) for i in ids if int(i) in control), None)
