"""Defusing chat control tokens in user text (questions, documents, chunks, drafts).

Lives below every layer (models, prompts and nodes all use it) so that there is exactly one
function deciding what user text may contain when it enters a prompt.
"""

from __future__ import annotations

import functools
import re

# Chat-template control tokens written inside user text (a question, a document, a retrieved
# chunk) must stay text: otherwise a document could open a fake system turn. Fragments are
# defused too ("<|" alone, "|>" alone), so two pieces of text can never join into a token.
# Covered without knowing the tokenizer: ChatML / Qwen / SmolLM2 ``<|...|>`` (any fragment),
# Llama ``<s>``, ``</s>``, ``[INST]``, ``<<SYS>>``, and tags with an underscore (Gemma
# ``<start_of_turn>``, SmolLM2 ``<file_sep>``, Qwen ``<tool_call>``). Ordinary markup and
# code (``<div>``, ``List<String>``) is left alone; a tokenizer's own added tokens (SmolLM2's
# ``<reponame>``) are passed as ``specials`` by the code that tokenizes (models/local.py).
_WORD_TOKEN = re.compile(
    r"</?(?:s|unk|pad|bos|eos|[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)>"
    r"|\[/?(?:INST|SYS)\]|<</?SYS>>",
    re.IGNORECASE,
)


def break_token(token: str) -> str:
    """``token`` as text that no tokenizer reads as that token (a reader still sees it)."""
    if token.startswith("<"):
        return "\u2039" + token[1:]
    return token[:1] + "\u2060" + token[1:]  # a word joiner after the first character


def defuse(text: str, specials: tuple[str, ...] = ()) -> str:
    """User text with every chat control token (and fragment of one) made inert.

    The one function every path that puts user text into a prompt uses (questions, evidence,
    drafts, long documents and the RAPID drafter's chunks). ``<`` becomes ``\u2039`` and ``>``
    becomes ``\u203a`` inside control tokens, so a reader still sees the text.
    """
    for token in specials:  # the tokenizer's own added tokens, longest first
        if len(token) > 1 and token in text:
            text = text.replace(token, break_token(token))
    text = _WORD_TOKEN.sub(
        lambda m: (
            m.group(0)
            .replace("<", "\u2039")
            .replace(">", "\u203a")
            .replace("[", "(")
            .replace("]", ")")
        ),
        text,
    )
    text = text.replace("<|", "\u2039|").replace("|>", "|\u203a")
    # a trailing "<" or a leading ">" could join a neighbouring text's "|" into a token
    if text.endswith("<"):
        text = text[:-1] + "\u2039"
    if text.startswith(">"):
        text = "\u203a" + text[1:]
    return text


@functools.cache
def _tag_start(names: tuple[str, ...], prefixes: bool = False) -> re.Pattern[str]:
    """The ``<`` of a ``<name`` or ``</name`` (``names``) that ends there: a tag or its start.

    With ``prefixes``, of any word that starts with a name too (``<evidence_count``).
    """
    alternatives = "|".join(map(re.escape, names))
    end = "" if prefixes else r"(?:[\s/>]|\Z)"
    return re.compile(rf"<(?=\s*/?\s*(?:{alternatives}){end})", re.IGNORECASE)


def break_tag_starts(text: str, names: tuple[str, ...]) -> str:
    """:func:`break_tags`, and the ``<`` of any word that starts with a name broken too.

    For text whose answer stops at a name's start (serial RAG's answer stops at
    ``"<evidence"``, an invented block): ``i<evidence_count`` quoted from a chunk ended the
    answer at ``i``. ``List<Evidence>`` and ``i<evidence_count`` keep their words.
    """
    return _tag_start(names, prefixes=True).sub("\u2039", text)


def break_tags(text: str, names: tuple[str, ...]) -> str:
    """``text`` in which no ``<name ...>`` or ``</name>`` tag (``names``) is one any more.

    The ``<`` of each (a whole tag, or the start of one cut off) becomes ``\u2039``; the rest
    stays, so code that looks like one reads as before (``List<Document>`` becomes
    ``List\u2039Document>``, ``i<document.forms`` and ``<DocumentRoot`` stay as they are).
    What delimits user text in a prompt (evidence blocks, a long document) is kept from the
    text it delimits.
    """
    return _tag_start(names).sub("\u2039", text)
