"""Defusing chat control tokens in user text (questions, documents, chunks, drafts).

Lives below every layer (models, prompts and nodes all use it) so that there is exactly one
function deciding what user text may contain when it enters a prompt.
"""

from __future__ import annotations

import re

# Chat-template control tokens written inside user text (a question, a document, a retrieved
# chunk) must stay text: otherwise a document could open a fake system turn. Fragments are
# defused too ("<|" alone, "|>" alone), so two pieces of text can never join into a token.
# Covered: ChatML / Qwen / SmolLM2 ``<|...|>`` (any fragment), Llama ``<s>``, ``</s>``,
# ``[INST]``, ``<<SYS>>``, and every one-word tag ``<word>`` / ``</word>``: tokenizers add such
# tokens freely (SmolLM2 ``<reponame>``, ``<filename>``, ``<file_sep>``; Gemma
# ``<start_of_turn>``; Qwen ``<tool_call>``), and in plain text a defused tag still reads well.
_WORD_TOKEN = re.compile(r"</?[A-Za-z][A-Za-z0-9_]*>|\[/?(?:INST|SYS)\]|<</?SYS>>")


def defuse(text: str) -> str:
    """User text with every chat control token (and fragment of one) made inert.

    The one function every path that puts user text into a prompt uses (questions, evidence,
    drafts, long documents and the RAPID drafter's chunks). ``<`` becomes ``\u2039`` and ``>``
    becomes ``\u203a`` inside control tokens, so a reader still sees the text.
    """
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
