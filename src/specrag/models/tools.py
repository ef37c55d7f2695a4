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
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import ToolCallChunk, tool_call_chunk

from specrag.defuse import defuse

TOOL_OPEN = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def supports_tools(tokenizer: Any) -> bool:
    """True when the tokenizer's chat template renders a ``tools`` list."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: any that mentions tools
        template = " ".join(map(str, template.values()))
    return bool(re.search(r"\btools\b", str(template)))


def tool_names(tools: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The names of OpenAI-style tool schemas (``bind_tools``'), in order."""
    return tuple(t["function"]["name"] for t in tools)


def plain_choice(tool_choice: Any) -> str | None:
    """A ``tool_choice`` as one value: None (the model decides), "none", "any" or a name.

    OpenAI's ``{"function": {"name"}}`` and Anthropic's ``{"type": ...}`` dicts included:
    ``{"type": "any"}`` was read as a tool named None, and ``{"type": "none"}`` left the
    tools bound (a review, 2026-12-07).
    """
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")  # {"name": ...}, or a name given bare
        if isinstance(function, dict):
            function = function.get("name")
        named = (function if isinstance(function, str) else None) or tool_choice.get("name")
        tool_choice = named or tool_choice.get("type")
    if tool_choice in (None, "auto"):
        return None
    if tool_choice in ("none", False):
        return "none"
    if tool_choice in ("any", "required", True):
        return "any"
    return str(tool_choice)


def tool_choice_name(tool_choice: Any, tools: Sequence[dict[str, Any]]) -> str | None:
    """The tool a ``tool_choice`` forces (None: the model decides).

    ``"any"``/``"required"``/``True`` force a call: of the only tool, else the model picks.
    """
    names = list(tool_names(tools))
    choice = plain_choice(tool_choice)
    if choice in (None, "none"):
        return None
    if choice == "any":
        return names[0] if len(names) == 1 else None
    if choice not in names:
        raise ValueError(f"tool_choice {choice!r} is not one of the bound tools {names}")
    return choice


def forced_call_prefix(name: str) -> str:
    """The text an answer forced to call ``name`` starts with (fed as part of the prompt).

    It opens the arguments' object too: ending at ``"arguments": `` let a small model write a
    bare value (the pair's 0.5B wrote ``31`` for a person's schema), an invalid call, so
    ``with_structured_output`` returned None.
    """
    return f'{TOOL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": {{'


def forced_prefix(tool_choice: Any, tools: Sequence[dict[str, Any]]) -> str:
    """What an answer under ``tool_choice`` starts with.

    A named tool's call head; a call's opening for ``"any"`` among several tools (the model
    writes which); else nothing.
    """
    name = tool_choice_name(tool_choice, tools)
    if name is not None:
        return forced_call_prefix(name)
    if plain_choice(tool_choice) == "any":
        return f'{TOOL_OPEN}\n{{"name": "'
    return ""


_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "user"}
# a ChatMessage's role -> its kind (a review, 2026-12-07: role "assistant" rendered as a user)
_CHAT_ROLES = {"assistant": "ai", "ai": "ai", "system": "system", "tool": "tool"}
_CHAT_ROLES |= {"user": "human", "human": "human"}


def message_kind(message: BaseMessage) -> str:
    """``human``, ``ai``, ``system`` or ``tool`` for a message or its chunk class.

    A streamed answer added up (``AIMessageChunk``) and kept in the history has the type
    ``"AIMessageChunk"``: it is the assistant's turn all the same.
    """
    for cls, kind in (
        (HumanMessage, "human"),
        (AIMessage, "ai"),
        (SystemMessage, "system"),
        (ToolMessage, "tool"),
    ):
        if isinstance(message, cls):
            return kind
    if isinstance(message, ChatMessage):  # its type is "chat": the role says whose turn
        return _CHAT_ROLES.get(message.role, "human")
    return message.type


def template_messages(messages: Sequence[BaseMessage], tools: bool) -> list[dict[str, Any]]:
    """LangChain messages -> chat-template dicts (text defused by the caller).

    With ``tools``, an AI message's tool calls and a tool message's role are kept (the
    template renders them as ``<tool_call>`` / ``<tool_response>`` turns); without, a tool
    result is a user turn.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        kind = message_kind(m)
        d: dict[str, Any] = {"role": _ROLES.get(kind, "user"), "content": str(m.text)}
        if tools and kind == "tool":
            d["role"] = "tool"
        if tools and isinstance(m, AIMessage) and m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": tc["name"], "arguments": tc["args"]}}
                for tc in m.tool_calls
            ]
        out.append(d)
    return out


def defuse_dicts(dicts: list[dict[str, Any]], specials: tuple[str, ...]) -> list[dict[str, Any]]:
    """Defuse every turn but the system prompt (the application's own), as before tools.

    Assistant turns too: with the chat interface they come back from the caller's history.
    """
    out = []
    for d in dicts:
        if d["role"] != "system":
            d = {**d, "content": defuse(d["content"], specials)}
        if "tool_calls" in d:  # their names and arguments are rendered as text too
            d["tool_calls"] = _defuse_values(d["tool_calls"], specials)
        out.append(d)
    return out


def _defuse_values(value: Any, specials: tuple[str, ...]) -> Any:
    """``value`` with every string in it (dict keys too) defused, nested lists and dicts."""
    if isinstance(value, str):
        return defuse(value, specials)
    if isinstance(value, dict):
        return {_defuse_values(k, specials): _defuse_values(v, specials) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_defuse_values(v, specials) for v in value]
    return value


# Where a tool call starts. The chat template asks for <tool_call> blocks; small models also
# write the same JSON object in <tools> tags or a ```json fence (Qwen2.5-Coder-1.5B does, on
# the offline-agent test), so those count as calls too - only while tools are bound, and only
# where the object names a bound tool: any other JSON there is the answer's text (a config
# in a fence was cut from the answer, its decode stopped, and an invalid call filed).
# A weak opener (any but <tool_call>) opens a call only where a JSON object follows it (after a
# fence's info string and blank space): a fence of code, a bare word after <tools>, is text at
# once (an answer with a ```python fence was held back from the stream until its end).
OPENERS = (TOOL_OPEN, "<tools>", "```")  # and a bare object: _BARE
TOOL_CLOSE = "</tool_call>"
# a bare call object, pretty-printed or not (the first of a JSON array of calls too)
_BARE = re.compile(r'(?:\[\s*)?\{\s*"name"\s*:')
# the end of a text that may still become a bare call object's opening
_BARE_PARTIAL = re.compile(r'\[\s*\Z|(?:\[\s*)?\{\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?\Z')
# a code fence that starts a line (up to 3 spaces before it, as CommonMark has it)
_LINE_FENCE = re.compile(r"\n[ \t]{0,3}```")
# an opener, up to its object (the first of a JSON array of calls too)
_HEAD = re.compile(r"(?:<tools>|```[\w+.-]*[ \t]*)?\s*(?:\[\s*)?")
FENCE = "```"


def line_fences(text: str, line_start: bool = True) -> int:
    """Code fences that start a line of ``text`` (``line_start``: ``text`` starts a line)."""
    return len(_LINE_FENCE.findall(("\n" if line_start else "") + text))


def closes_a_fence(text: str, at: int, before: int = 0, line_start: bool = True) -> bool:
    """Whether the fence at ``at`` closes a code block ``text`` opened before it.

    ``before``: fences that started a line in the text shown ahead of ``text`` (a stream's
    earlier chunks); ``line_start``: whether ``text`` starts a line. A fence opens and closes
    a code block only at the start of a line (three backticks inline in prose do neither).
    A closing fence is text, not a call's opener, whatever follows it (a bare call right after
    a code block's end took the block's closing fence into the call).
    """
    if not text.startswith(FENCE, at):
        return False
    ahead = ("\n" if line_start else "") + text[:at]
    if not re.search(r"\n[ \t]{0,3}\Z", ahead):
        return False
    return (before + len(_LINE_FENCE.findall(ahead))) % 2 == 1


_FENCED = re.compile(r"\A\s*```[\w+.-]*[ \t]*\n?(.*?)\n?\s*(?:```\s*)?\Z", re.DOTALL)


def find_opener(text: str, start: int = 0) -> int:
    """Where the first tool-call opener in ``text`` (from ``start``) begins; -1: none."""
    found = [i for i in (text.find(o, start) for o in OPENERS) if i >= 0]
    bare = _BARE.search(text, start)
    if bare is not None:
        found.append(bare.start())
    return min(found, default=-1)


def opener_pending(text: str) -> int:
    """Length of the end of ``text`` that may still become a tool-call opener (held back)."""
    keep = partial_start(text, OPENERS)
    for cut in (text.rfind("["), text.rfind("{")):
        if cut >= 0 and _BARE_PARTIAL.match(text, cut):
            keep = max(keep, len(text) - cut)
    return keep


def weak_head(captured: str) -> bool | None:
    """After a weak opener (``captured`` starts with it): does a JSON object follow it?

    None: not known yet (the opener's line, or blank space, is all there is so far).
    """
    at = _HEAD.match(captured)
    rest = captured[at.end() :] if at else captured
    if not rest:
        return None
    return rest.startswith("{")


def _unfenced(body: str) -> str:
    """A call body without the ```json fence a model may write inside <tool_call> tags."""
    fenced = _FENCED.match(body) if body.lstrip().startswith("```") else None
    return fenced.group(1).strip() if fenced else body


def _outside_strings(text: str, start: int = 0, line_ends_string: bool = False) -> Iterator[int]:
    """Positions in ``text`` (from ``start``) outside JSON strings (their quotes excluded).

    ``line_ends_string``: a line break ends a string too (JSON strings hold none).
    """
    in_str, escaped = False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"' or (line_ends_string and ch == "\n"):
                in_str = False
        elif ch == '"':
            in_str = True
        else:
            yield i


def _closed_at(text: str) -> int | None:
    """The end of the first ``</tool_call>`` in ``text`` outside a JSON string; None: none.

    A call cut inside a string (``"query": "Nor`` then a new line) is closed by its tag still.
    """
    for i in _outside_strings(text, line_ends_string=True):
        if text.startswith(TOOL_CLOSE, i):
            return i + len(TOOL_CLOSE)
    return None


def partial_start(text: str, sequences: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that one of ``sequences`` starts with (not whole).

    What a stream holds back: text that may still become a tool-call opener or a stop sequence.
    """
    keep = 0
    for seq in sequences:
        for k in range(min(len(seq) - 1, len(text)), keep, -1):
            if text.endswith(seq[:k]):
                keep = k
                break
    return keep


def _first_object(text: str) -> tuple[int, int] | None:
    """Span of the first complete top-level JSON object in ``text`` (strings respected)."""
    begin = text.find("{")
    if begin < 0:
        return None
    depth = 0
    for i in _outside_strings(text, begin):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return begin, i + 1
    return None


def _as_call(body: str) -> tuple[str, dict[str, Any]] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if args is None:  # ``"arguments": null``: a call without arguments
        args = {}
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return (data["name"], args) if isinstance(args, dict) else None


def _named(body: str) -> str | None:
    """The tool name a (maybe broken) call object gives, from its text."""
    found = re.search(r'"name"\s*:\s*"([^"]+)"', body)
    return found.group(1) if found else None


def _weak_call(body: str, names: Sequence[str]) -> bool:
    """Whether ``body`` after a weak opener (not ``<tool_call>``) is a call, maybe a broken one.

    A call object (or a broken object naming a tool) of a bound tool (any name where
    ``names`` is empty); other JSON is text.
    """
    call = _as_call(body)
    name = call[0] if call is not None else _named(body)
    return name is not None and (not names or name in names)


def _weak_piece(text: str, names: Sequence[str]) -> tuple[int, int, str, str] | None:
    """The first call after a weak opener: (begin, end, its raw text, its object's text)."""
    start = 0
    while True:
        at = find_opener(text, start)
        if at < 0:
            return None
        if closes_a_fence(text, at) or not weak_head(text[at:]):  # text, as the stream shows
            start = at + 1
            continue
        span = _first_object(text[at:])
        end = at + span[1] if span else len(text)
        body = text[at + span[0] : at + span[1]] if span else text[at:]
        if _weak_call(body, names):
            tail = text[end:].lstrip()
            if tail.startswith("]"):  # an array of calls: the first is the call
                tail = tail[1:].lstrip()
            for closer in ("</tools>", "</tool_call>", "```"):  # the opener's closing tag/fence
                if tail.startswith(closer):
                    end = len(text) - len(tail) + len(closer)
                    break
                if closer.startswith(tail):  # cut off inside the closer: drop that part too
                    end = len(text)
                    break
            return at, end, text[at:end], body
        if not span:
            return None
        start = end


def _blocks(text: str) -> list[tuple[int, int, str, str]]:
    """Each ``<tool_call>`` block (an unclosed one at the end too): (begin, end, raw, body).

    A block ends at its first ``</tool_call>``, unless that sits inside a string of the call's
    JSON (a question quoting the tag): a body that is no call there but a complete call object
    followed by the closing tag (or the text's end) ends after the object. The streamed
    capture (:class:`ToolCapture`) stops there too; a regex alone cut the call in two.
    """
    pieces: list[tuple[int, int, str, str]] = []
    for m in _BLOCK.finditer(text):
        begin, end, body = m.start(), m.end(), _unfenced(m.group(1).strip())
        if _as_call(body) is None:
            inner = m.start(1)
            span = _first_object(text[inner:])
            if span is not None and _HEAD.fullmatch(text[inner : inner + span[0]].lstrip()):
                tail = text[inner + span[1] :]
                rest = tail.lstrip()
                closed = rest.startswith("</tool_call>")
                if (closed or not rest) and _as_call(text[inner + span[0] : inner + span[1]]):
                    body = text[inner + span[0] : inner + span[1]]
                    end = len(text) - len(rest) + (len("</tool_call>") if closed else 0)
        if pieces and begin < pieces[-1][1]:  # inside the block just widened
            continue
        pieces.append((begin, end, text[begin:end], body))
    return pieces


def parse_tool_calls(text: str, names: Sequence[str] = ()) -> tuple[str, list[ToolCallChunk]]:
    """Split generated text into (content, tool-call chunks).

    Each ``<tool_call>`` block (an unclosed one at the end too) becomes one chunk; without any,
    a tool-call object after another opener (``<tools>``, a ``json`` fence, a bare
    ``{"name": ...}``) does, where it names one of ``names`` (the bound tools; any name where
    empty): other JSON there stays text. A JSON object with a ``name`` gets its
    ``arguments`` as the chunk's JSON args; anything else keeps its raw text (starting with
    the opener, so never valid JSON) as args, which LangChain files under
    ``invalid_tool_calls``.
    """
    chunks: list[ToolCallChunk] = []
    spans: list[tuple[int, int]] = []
    pieces = _blocks(text)
    if not pieces:
        piece = _weak_piece(text, names)
        pieces = [piece] if piece else []
    for index, (begin, end, raw, body) in enumerate(pieces):
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        spans.append((begin, end))
        call = _as_call(body)
        if call is not None:
            name, args = call
            chunks.append(
                tool_call_chunk(name=name, args=json.dumps(args), id=call_id, index=index)
            )
        else:
            if not raw.startswith("<"):
                raw = "<tool_call>" + raw  # keep invalid args from ever parsing as JSON
            chunks.append(
                tool_call_chunk(
                    name=_named(body),
                    args=raw,
                    id=call_id,
                    index=index,
                )
            )
    if not chunks:
        return text, []
    content, last = "", 0
    for begin, end in spans:
        content += text[last:begin]
        last = end
    content += text[last:]
    return content.strip(), chunks


class ToolCapture:
    """Streams text up to the first tool-call opener; captures the rest for parsing at the end.

    A tail that may still become an opener is held back, so no part of one is shown. Once the
    captured call's JSON object is complete, ``done`` tells the decoder to stop (a small model
    otherwise goes on to invent the tool's result). After a weak opener (not ``<tool_call>``)
    a complete object that calls none of ``names`` (the bound tools) is answer text after
    all: it is shown then, and the decode goes on.
    """

    def __init__(self, forced: str = "", names: Sequence[str] = ()) -> None:
        self.pending = ""
        self.captured = forced
        self.capturing = bool(forced)
        self.names = tuple(names)
        self.weak = False  # captured after a weak opener: may still turn out to be text
        self.fences = 0  # code fences that started a line of the text shown (odd: in a block)
        self.line_start = True  # the text shown so far ends a line (or is none)

    @property
    def done(self) -> bool:
        """True once a complete tool-call object has been captured.

        Read by the model thread while :meth:`feed` runs on another: it judges the object
        itself, so a moment in which ``feed`` holds a complete object it is about to show as
        text never reads as a call.
        """
        captured, weak = self.captured, self.weak
        if not self.capturing:
            return False
        return self._end(captured, weak) is not None

    def call_end(self) -> int | None:
        """Where in ``captured`` the call ends (None: no complete call captured)."""
        return self._end(self.captured, self.weak) if self.capturing else None

    def _end(self, captured: str, weak: bool) -> int | None:
        """Where the captured call ends (None: not yet).

        Its object's end (after a weak opener: an object calling a bound tool), or a
        ``<tool_call>`` block's closing tag (a broken call: a missing brace must not let the
        model go on to invent the tool's result).
        """
        if weak and weak_head(captured) is False:
            return None
        span = _first_object(captured)
        if weak:
            ok = span is not None and _weak_call(captured[span[0] : span[1]], self.names)
            return span[1] if span is not None and ok else None
        closed = _closed_at(captured)
        if span is not None and (closed is None or span[1] <= closed):
            return span[1]
        return closed

    def feed(self, delta: str) -> str:
        """The part of ``delta`` that is answer text."""
        if self.capturing:
            self.captured += delta
            if not self.weak:
                return ""
            if weak_head(self.captured) is False:  # no object after the opener: text
                head = _HEAD.match(self.captured)
                cut = max(1, head.end() if head else 0)
                text, rest = self.captured[:cut], self.captured[cut:]
                self.capturing, self.weak, self.captured = False, False, ""
                return self._shown(text) + self.feed(rest)
            span = _first_object(self.captured)
            if span and not _weak_call(self.captured[span[0] : span[1]], self.names):
                text, rest = self.captured[: span[1]], self.captured[span[1] :]
                self.capturing, self.weak, self.captured = False, False, ""
                return self._shown(text) + self.feed(rest)
            return ""
        buf = self.pending + delta
        at, text_to = find_opener(buf), 0
        while at >= 0 and closes_a_fence(buf, at, self.fences, self.line_start):  # a block's end
            text_to = at + len(FENCE)
            at = find_opener(buf, text_to)
        if at >= 0:
            self.weak = not buf.startswith(TOOL_OPEN, at)  # before capturing: ``done`` reads both
            self.captured, self.pending = buf[at:], ""
            self.capturing = True
            return self._shown(buf[:at]) + self.feed("")
        # held back: what may still open a call, never part of a closing fence (shown whole,
        # so that the fences shown are counted right)
        keep = min(opener_pending(buf), len(buf) - text_to)
        self.pending = buf[len(buf) - keep :] if keep else ""
        return self._shown(buf[: len(buf) - keep])

    def _shown(self, text: str) -> str:
        """``text``, shown: its line-starting code fences counted (before what follows it)."""
        if text:
            self.fences += line_fences(text, self.line_start)
            self.line_start = text.endswith("\n")
        return text

    def finish(self) -> tuple[str, list[ToolCallChunk]]:
        """(text still to show, tool-call chunks) once decoding is over."""
        tail, self.pending = self.pending, ""
        if not self.captured:
            return tail, []
        # A verify pass can accept several tokens at once, past the call's end: cut there, as
        # a one-token decode stops there (``done``), so the text after it never counts.
        end = self._end(self.captured, self.weak)
        captured = self.captured[:end] if end is not None else self.captured
        content, chunks = parse_tool_calls(captured, self.names)
        return tail + content, chunks


def any_valid(chunks: Sequence[ToolCallChunk]) -> bool:
    """Whether one of ``chunks`` is a call LangChain files under ``tool_calls`` (JSON args)."""
    return any(str(c.get("args") or "").startswith("{") for c in chunks)
