"""Tool calling on local models: schemas through the chat template, tool-call blocks parsed.

A model can call tools when its tokenizer's chat template renders ``tools`` (the Qwen2.5 family
does: the schemas go into the system turn and the model answers with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks). :func:`parse_tool_calls`
turns those blocks into LangChain tool-call chunks; a block that is not a JSON object with a
``name`` becomes an *invalid* tool call (``AIMessage.invalid_tool_calls``), never an exception
in the agent loop. A template without tool support is refused at ``bind_tools`` time.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.tool import ToolCallChunk, tool_call_chunk

from specrag.defuse import defuse

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def supports_tools(tokenizer: Any) -> bool:
    """True when the tokenizer's chat template renders a ``tools`` list."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: any that mentions tools
        template = " ".join(map(str, template.values()))
    return bool(re.search(r"\btools\b", str(template)))


def tool_choice_name(tool_choice: Any, tools: Sequence[dict[str, Any]]) -> str | None:
    """The tool a ``tool_choice`` forces (None: the model decides).

    ``"any"``/``"required"``/``True`` force a call: of the only tool, else the model picks.
    """
    names = [t["function"]["name"] for t in tools]
    if tool_choice in (None, "auto", "none", False):
        return None
    if isinstance(tool_choice, dict):
        tool_choice = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    if tool_choice in ("any", "required", True):
        return names[0] if len(names) == 1 else None
    if tool_choice not in names:
        raise ValueError(f"tool_choice {tool_choice!r} is not one of the bound tools {names}")
    return str(tool_choice)


def forced_call_prefix(name: str) -> str:
    """The text an answer forced to call ``name`` starts with (fed as part of the prompt)."""
    return f'{TOOL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '


def template_messages(messages: Sequence[BaseMessage], tools: bool) -> list[dict[str, Any]]:
    """LangChain messages -> chat-template dicts; user and tool text defused by the caller.

    With ``tools``, an AI message's tool calls and a tool message's role are kept (the
    template renders them as ``<tool_call>`` / ``<tool_response>`` turns); without, a tool
    result is a user turn.
    """
    roles = {"human": "user", "ai": "assistant", "system": "system", "tool": "user"}
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": roles.get(m.type, "user"), "content": str(m.text)}
        if tools and m.type == "tool":
            d["role"] = "tool"
        if tools and isinstance(m, AIMessage) and m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": tc["name"], "arguments": tc["args"]}}
                for tc in m.tool_calls
            ]
        out.append(d)
    return out


def defuse_dicts(dicts: list[dict[str, Any]], specials: tuple[str, ...]) -> list[dict[str, Any]]:
    """Defuse user and tool text (system prompts and the model's own turns are trusted)."""
    return [
        {**d, "content": defuse(d["content"], specials)} if d["role"] in ("user", "tool") else d
        for d in dicts
    ]


def parse_tool_calls(text: str) -> tuple[str, list[ToolCallChunk]]:
    """Split generated text into (content, tool-call chunks).

    Each ``<tool_call>`` block (an unclosed one at the end too) becomes one chunk. A block whose
    body is a JSON object with a ``name`` gets its ``arguments`` as the chunk's JSON args; any
    other block keeps its raw text as args (not JSON), which LangChain files under
    ``invalid_tool_calls``.
    """
    chunks: list[ToolCallChunk] = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        body = match.group(1).strip()
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        try:
            data = json.loads(body)
            name = data["name"] if isinstance(data, dict) else None
            args = data.get("arguments", data.get("parameters", {})) if name else None
            if not isinstance(name, str) or not isinstance(args, dict):
                raise ValueError("not a tool call object")
            chunks.append(
                tool_call_chunk(name=name, args=json.dumps(args), id=call_id, index=index)
            )
        except (ValueError, KeyError, TypeError):
            raw = match.group(0)  # starts with "<tool_call>": never parses as JSON
            name_match = re.search(r'"name"\s*:\s*"([^"]+)"', body)
            chunks.append(
                tool_call_chunk(
                    name=name_match.group(1) if name_match else None,
                    args=raw,
                    id=call_id,
                    index=index,
                )
            )
    content = _BLOCK.sub("", text).strip() if chunks else text
    return content, chunks


class ToolCapture:
    """Streams text up to the first ``<tool_call>``; captures the rest for parsing at the end.

    A tail that may still become ``<tool_call>`` is held back, so no part of a tag is shown.
    """

    def __init__(self, forced: str = "") -> None:
        self.pending = ""
        self.captured = forced
        self.capturing = bool(forced)

    def feed(self, delta: str) -> str:
        """The part of ``delta`` that is answer text."""
        if self.capturing:
            self.captured += delta
            return ""
        buf = self.pending + delta
        at = buf.find(TOOL_OPEN)
        if at >= 0:
            self.capturing, self.captured, self.pending = True, buf[at:], ""
            return buf[:at]
        keep = next(
            (
                k
                for k in range(min(len(TOOL_OPEN) - 1, len(buf)), 0, -1)
                if buf.endswith(TOOL_OPEN[:k])
            ),
            0,
        )
        self.pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def finish(self) -> tuple[str, list[ToolCallChunk]]:
        """(text still to show, tool-call chunks) once decoding is over."""
        tail, self.pending = self.pending, ""
        if not self.captured:
            return tail, []
        content, chunks = parse_tool_calls(self.captured)
        return tail + content, chunks
