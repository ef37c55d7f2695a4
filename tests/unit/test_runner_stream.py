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


class EarlyRetractionApp:
    """The draft streamed; the answer's first tokens were held back (a possible stop
    sequence) and retracted by a later batch before any of them was shown."""

    async def astream(self, inputs, config=None, context=None, stream_mode=None):
        yield "messages", (AIMessageChunk(content="Rollo, I think"), {"langgraph_node": "draft"})
        yield "custom", {"event": "revise", "keep": 0, "dropped_text": "\n"}
        yield "messages", (AIMessageChunk(content="Rollo."), {"langgraph_node": "refine"})
        yield "values", {"answer": "Rollo."}


def test_a_retraction_before_the_answer_shows_leaves_the_draft_alone(capsys):
    """It cut the draft's text by the answer's offsets and redrew it as "answer (draft):"."""
    asyncio.run(runner._run(EarlyRetractionApp(), {}, None, True, {}))
    said = capsys.readouterr().err
    assert "answer (draft)" not in said
    assert said.index("Rollo, I think") < said.index("revised") < said.index("answer (refine)")


def test_a_failed_answer_nodes_streamed_text_is_marked_failed(capsys):
    """refine's streamed text was followed by generate's with no word that refine failed:
    it read as two answers. The graph says `answer_failed`; the CLI prints it."""
    from specrag.graph.builder import build_graph
    from tests.fakes import FakeLogprobChat, ctx, services

    calls = {"n": 0}

    class BreaksOnce(FakeLogprobChat):  # refine: its first words stream, then it breaks
        def _stream(self, *a, **k):
            calls["n"] += 1
            for i, chunk in enumerate(super()._stream(*a, **k)):
                if calls["n"] == 1 and i == 2:
                    raise RuntimeError("connection reset")
                yield chunk

    app = build_graph(services(answer=BreaksOnce(reply="Paris is the capital.", calls=[])))
    final = asyncio.run(runner._run(app, {"question": "capital?"}, ctx(), True, {}))
    assert final["route"] == "generate" and final["answer"] == "Paris is the capital."
    said = capsys.readouterr().err
    assert "answer (refine): Paris is" in said
    assert "refine failed: RuntimeError: connection reset" in said
    assert said.index("refine failed") < said.index("answer (generate): Paris is the capital.")


def test_a_remote_drafts_stop_sequence_cut_is_taken_off_the_draft_line(capsys):
    """A remote draft's stop-sequence cut said "revised: retracted ..." but left the invented
    "Question: ..." on the draft line: the event did not say whose text it cut (a review,
    2026-12-07). It names its node now; an answer's event still leaves the draft alone."""
    from specrag.graph.builder import build_graph
    from tests.fakes import FakeLogprobChat, ctx, services

    draft = FakeLogprobChat(reply="Rollo led them.\nQuestion: who else?", calls=[])
    app = build_graph(services(draft=draft))
    final = asyncio.run(runner._run(app, {"question": "capital?"}, ctx(), True, {}))
    assert final["draft"] == "Rollo led them."
    said = capsys.readouterr().err
    redrawn = said[said.index("revised") :]
    assert "draft (unverified): Rollo led them." in redrawn
    assert "Question:" not in redrawn.split("draft (unverified):")[1].split("route")[0]


class DraftAcrossABatchApp:
    """The draft goes on streaming after an evidence batch (``draft_policy="complete"`` with
    ``answer_policy="incremental"``), or stops at it (the default)."""

    def __init__(self, goes_on: bool):
        self.goes_on = goes_on

    async def astream(self, inputs, config=None, context=None, stream_mode=None):
        draft = {"langgraph_node": "draft"}
        yield "messages", (AIMessageChunk(content="Paris is"), draft)
        yield "custom", {"event": "batch", "source": "hybrid", "chunks": [{}], "arrival_s": 0.3}
        if self.goes_on:
            yield "messages", (AIMessageChunk(content=" the capital"), draft)
        yield "messages", (AIMessageChunk(content="Paris."), {"langgraph_node": "refine"})
        yield "values", {"answer": "Paris."}


def test_a_draft_that_goes_on_after_a_batch_note_goes_on_below_it(capsys):
    """A review (2026-12-07): the rest of the draft was printed after the note, on its line:
    "evidence batch (hybrid, 1 chunks) at 0.30s the capital". A draft that stops at the
    evidence is not printed twice."""
    asyncio.run(runner._run(DraftAcrossABatchApp(goes_on=True), {}, None, True, {}))
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("evidence batch") and line.endswith("0.30s") for line in lines)
    assert "draft (unverified): Paris is the capital" in lines
    asyncio.run(runner._run(DraftAcrossABatchApp(goes_on=False), {}, None, True, {}))
    said = capsys.readouterr().err
    assert said.count("Paris is") == 1 and "answer (refine): Paris." in said
