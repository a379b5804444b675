"""Control tokens: the ids a tokenizer emits for markup rather than text (bos, eos, chat markers, reserved ids).

Every added token is one: the tokenizer matches its text before splitting words, so a `<|eot_id|>` or `<s>` written
inside data text becomes that id, not the characters (unless it is matched as text, which `literal_controls` asks
the tokenizer itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def control_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """id -> text of bos/eos/pad/unk and of every added token (special or not)."""
    tokens = {int(added_id): added.content for added_id, added in tokenizer.added_tokens_decoder.items()}
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(tokenizer, f"{role}_token_id")
        if token_id is not None:
            tokens.setdefault(int(token_id), getattr(tokenizer, f"{role}_token"))
    return tokens


def literal_controls(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """text -> id of the control tokens whose text, written in data, the tokenizer turns into that one id."""
    tokens = control_tokens(tokenizer)
    # Whitespace runs Gemma's vocabulary adds as tokens ("\n", "\n\n") are text wherever they appear.
    texts = [text for text in tokens.values() if text and text.strip()]
    if not texts:
        return {}
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    ids = {text: token_id for token_id, text in tokens.items()}
    return {text: ids[text] for text, got in zip(texts, encoded, strict=True) if got == [ids[text]]}


# What chat templates put after a turn's closing token: newlines and spaces.
_WHITESPACE = ("\n", "\n\n", "\n\n\n", " ", "  ", "\t", "\r\n", " \n", "\n ")


def whitespace_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of whitespace-only tokens a template's newlines and spaces encode to (SentencePiece's bare "▁" too)."""
    encoded = tokenizer(list(_WHITESPACE), add_special_tokens=False)["input_ids"]
    return {int(i) for ids in encoded for i in ids}
