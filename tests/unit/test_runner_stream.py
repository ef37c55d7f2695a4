"""The CLI's live stream of a run on stderr (``runner._run``)."""

import asyncio

from langchain_core.messages import AIMessageChunk

from specrag import runner


class PartsApp:
    """A compiled graph's stand-in whose answer arrives as content parts, as a provider's
    (Anthropic, OpenAI's Responses API) message chunks do."""

    async def astream(self, inputs, config=None, context=None, stream_mode=None):
        meta = {"langgraph_node": "generate"}
        for part in ("Use :x: ", "for no."):
            chunk = AIMessageChunk(content=[{"type": "text", "text": part, "index": 0}])
            yield "messages", (chunk, meta)
        yield "values", {"answer": "Use :x: for no."}


def test_a_streamed_answer_in_content_parts_is_shown_as_its_text(capsys):
    """`shown += chunk.content` raised a TypeError mid-answer on a list of parts, and rich
    printed ":x:" as an emoji (a review, 2026-12-06)."""
    final = asyncio.run(runner._run(PartsApp(), {}, None, True, {}))
    assert final == {"answer": "Use :x: for no."}
    said = capsys.readouterr().err
    assert "answer (generate):" in said and "Use :x: for no." in said


def test_the_cli_prints_emoji_codes_as_written(capsys):
    from specrag import cli

    cli.out.print("Answer: use :white_check_mark:")
    cli.err.print("source: notes:x:.md")
    said = capsys.readouterr()
    assert said.out.strip() == "Answer: use :white_check_mark:"
    assert said.err.strip() == "source: notes:x:.md"
