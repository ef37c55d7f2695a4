"""Stop sequences end a local model's text before an invented next turn (issue 9 #9a)."""

import time

from specrag.decoding.speculative import Token
from tests.unit.test_budgets import SlowLocal


class Words(SlowLocal):
    """Decodes a fixed text, one word per step, ignoring stop requests for a while.

    A word may be bytes, as a byte-level BPE's token is: part of a character decodes as
    U+FFFD until the rest comes.
    """

    words: list[str | bytes] = []

    def _job(self, messages, options):
        job = super()._job(messages, options)
        words = [w.encode() if isinstance(w, str) else w for w in self.words]

        class Tok:
            def decode(self, ids, skip_special_tokens=True, **_):
                return b"".join(words[i] for i in ids).decode("utf-8", errors="replace")

        job.tokenizer = Tok()
        return job


TEXT = ["Rollo", " led", " them", ".\n", "\nQue", "stion:", " What", " next", "?"]


def test_stop_sequence_split_over_tokens_ends_the_text_before_it():
    model = Words(steps=len(TEXT), step_s=0.0, words=TEXT)
    msg = model.invoke("q", stop=["\nQuestion:"])
    assert msg.content == "Rollo led them.\n"
    assert msg.response_metadata["finish_reason"] == "stop_sequence"
    assert msg.response_metadata["truncated"] is False
    streamed = "".join(c.content for c in model.stream("q", stop=["\nQuestion:"]))
    assert streamed == "Rollo led them.\n"


def test_held_back_prefix_is_released_when_no_stop_follows():
    words = ["A", " B", "\nQue", "ue"]
    model = Words(steps=len(words), step_s=0.0, words=words)
    assert model.invoke("q", stop=["\nQuestion:"]).content == "A B\nQueue"
    assert model.invoke("q").content == "A B\nQueue"


def test_tokens_after_a_stop_are_not_counted():
    # review finding: tokens of the stop sequence (and after it) inflated counts and confidence
    model = Words(steps=len(TEXT), step_s=0.0, words=TEXT)
    msg = model.invoke("q", stop=["\nQuestion:"])
    assert msg.usage_metadata["output_tokens"] == 4  # "Rollo", " led", " them", ".\n"
    assert model.invoke("q", stop="\nQuestion:").content == "Rollo led them.\n"  # one string


def test_the_stats_name_tokens_decoded_past_a_stop():
    """The decoder stops between steps, so it may run past a stop sequence: its own counts
    (tokens_from, passes) include those tokens, ``new_tokens`` does not - ``decoded_tokens``
    says how many the counts cover (a review found sum(tokens_from) > new_tokens, 2026-12-06)."""

    class Counted(Words):
        def _job(self, messages, options):
            job = super()._job(messages, options)
            produce, made = job.produce, [0]

            def counting(should_stop):
                for step in produce(should_stop):
                    made[0] += len(step)
                    yield step

            job.produce = counting
            job.metadata = lambda: {"new_tokens": made[0], "tokens_from": {"target": made[0]}}
            return job

    model = Counted(steps=len(TEXT), step_s=0.0, words=TEXT)
    got = model.invoke("q", stop=["\nQuestion:"]).response_metadata["decoding"]
    assert got["new_tokens"] == 4 and got["decoded_tokens"] == got["tokens_from"]["target"] > 4
    assert "decoded_tokens" not in model.invoke("q").response_metadata["decoding"]


async def test_stream_model_drops_log_probs_of_tokens_in_the_stop_sequence():
    from specrag.models.options import DecodeOptions
    from specrag.nodes.streaming import stream_model

    model = Words(steps=len(TEXT), step_s=0.0, words=TEXT)
    out = await stream_model(
        model, "q", budget_s=5.0, tags=["answer"], options=DecodeOptions(stop=("\nQuestion:",))
    )
    assert out.text == "Rollo led them."
    assert out.tokens == 4 and len(out.logprobs) == 4, (out.tokens, out.logprobs)


def test_a_models_own_stop_list_applies_to_calls_that_name_none():
    """`ChatLocalLM(stop=[...])` was silently dropped (unknown arguments were ignored)."""
    model = Words(steps=len(TEXT), step_s=0.0, words=TEXT, stop=["\nQuestion:"])
    assert model.invoke("q").content == "Rollo led them.\n"
    assert model.invoke("q", stop=["them"]).content == "Rollo led "  # a call's own wins


def test_a_calls_empty_stop_list_or_its_options_stops_win_over_the_models():
    """`stop=[]` on a call fell back to the model's own list, and the model's list replaced
    the stop sequences of a call's `options=DecodeOptions(stop=...)` (a wrapper review)."""
    from specrag.models.options import DecodeOptions

    model = Words(steps=len(TEXT), step_s=0.0, words=TEXT, stop=["\nQuestion:"])
    assert model.invoke("q", stop=[]).content == "".join(TEXT)  # no stop at all
    call = DecodeOptions(stop=(" them",))
    assert model.invoke("q", options=call).content == "Rollo led"


def test_no_time_left_stops_at_once():
    """`max_time=0` (a budget already spent) meant no time limit at all."""
    model = Words(steps=len(TEXT), step_s=0.02, words=TEXT)
    msg = model.invoke("q", max_time=0)
    assert msg.response_metadata["truncated"] is True
    assert len(msg.content) < len("".join(TEXT))


async def test_a_cancelled_ainvoke_stops_its_decode():
    """`ainvoke` went through the sync `_generate` in an executor thread: a caller's timeout
    left the decode running to its end on the model thread (a wrapper review)."""
    import asyncio

    from tests.unit.test_budgets import SlowLocal

    steps: list[int] = []

    class Counting(SlowLocal):  # a decode that stops when asked, as the real ones do
        def _job(self, messages, options):
            job = super()._job(messages, options)

            def counted(should_stop):
                for i in range(self.steps):
                    if should_stop(i):
                        return
                    time.sleep(self.step_s)
                    steps.append(i)
                    yield [Token(i, -0.1, "model")]

            job.produce = counted
            return job

    model = Counting(steps=200, step_s=0.01)
    try:
        await asyncio.wait_for(model.ainvoke("q"), 0.2)
    except TimeoutError:
        pass
    await asyncio.sleep(0.3)
    seen = len(steps)
    await asyncio.sleep(0.3)
    assert seen < 100 and len(steps) == seen, len(steps)  # stopped, not still decoding
    assert (await model.ainvoke("q", max_new_tokens=3)).content  # and it still answers


def test_unknown_constructor_arguments_are_errors_and_langchain_names_are_aliases():
    """`ChatLocalLM(model="qwen2.5-coder-1.5b", max_tokens=100)` loaded SmolLM2 and decoded
    256 tokens: pydantic ignored both names."""
    import pytest
    from pydantic import ValidationError

    from specrag.models.chat import ChatLocalLM
    from specrag.models.options import DecodeOptions

    model = ChatLocalLM(model="qwen2.5-coder-1.5b", max_tokens=100)
    assert (model.model_name, model.max_new_tokens) == ("qwen2.5-coder-1.5b", 100)
    with pytest.raises(ValidationError, match="modle"):
        ChatLocalLM(modle="embedded")
    assert DecodeOptions.from_call({"max_tokens": 12}).max_new_tokens == 12  # per call too


def test_both_local_chat_models_check_their_arguments_when_built():
    """`ChatLocalLM(temperature=-1)` was accepted, `max_tokens=-1` failed only at invoke,
    `ChatRapid(max_tokens=10)` was refused, and ChatRapid.bind_tools raised a bare error."""
    import pytest
    from pydantic import ValidationError

    from specrag.models.chat import ChatLocalLM
    from specrag.models.rapid_chat import ChatRapid

    for cls in (ChatLocalLM, ChatRapid):
        assert cls(max_tokens=10).max_new_tokens == 10
        for bad in (
            {"temperature": -1.0},
            {"temperature": float("inf")},
            {"max_tokens": -1},
            {"max_new_tokens": -1},
        ):
            with pytest.raises(ValidationError):
                cls(**bad)
    with pytest.raises(NotImplementedError, match="use ChatLocalLM to bind tools"):
        ChatRapid().bind_tools([])
    # one field under two names: said as such (was "Extra inputs are not permitted: model")
    with pytest.raises(ValidationError, match="model_name: give one of model_name or model"):
        ChatLocalLM(model_name="embedded", model="embedded")
    with pytest.raises(ValidationError, match="give one of max_new_tokens or max_tokens"):
        ChatRapid(max_new_tokens=3, max_tokens=4)


def test_a_calls_own_temperature_or_limit_is_checked_too():
    """Per call, a NaN temperature failed deep in sampling, inf sampled uniformly and a
    negative one quietly meant greedy: each is a one-line ValueError now. A spent time budget
    stops at once."""
    import pytest

    from specrag.models.options import DecodeOptions

    model = Words(steps=len(TEXT), step_s=0.0, words=TEXT)
    for bad in (
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"temperature": -0.5},
        {"max_tokens": -1},
        {"temperature": "hot"},
        {"max_time": float("nan")},
    ):
        with pytest.raises(ValueError, match=next(iter(bad)).replace("max_tokens", "max_new")):
            model.invoke("q", **bad)
    assert DecodeOptions(max_time=-1.0).max_time == -1.0  # a budget already spent
    assert model.invoke("q", temperature=0.0, max_tokens=2, max_time=float("inf")).content


class Revising(Words):
    """An incremental answer as the model thread sends it: tokens that write a stop sequence,
    then (new evidence) a Revise keeping ``keep`` of them, then ``after`` more tokens."""

    keep: int = 2
    after: list[int] = []
    late: list[int] = []  # decoded after the stop sequence, before the Revise

    def _job(self, messages, options):
        job = super()._job(messages, options)
        keep, after, late = self.keep, self.after, self.late

        def produce(should_stop):
            from specrag.decoding.speculative import Revise

            yield [Token(0, -0.1, "model"), Token(1, -0.1, "model"), Token(2, -0.1, "model")]
            yield [Token(3, -0.1, "model"), Token(4, -0.1, "model"), Token(5, -0.1, "model")]
            waited = time.monotonic() + 10
            while should_stop(6) != "stop_sequence" and time.monotonic() < waited:
                time.sleep(0.002)  # the consumer has seen the stop sequence
            if late:
                yield [Token(i, -0.1, "model") for i in late]
            yield Revise(keep=keep, dropped=6 + len(late) - keep)
            if should_stop(keep):  # at once, before the consumer can apply the Revise
                return
            yield [Token(i, -0.1, "model") for i in after]

        job.produce = produce
        return job


async def test_a_revise_is_applied_before_its_stop_sequence_ends_the_decode():
    """The consumer's stop flag described the retracted text until it applied the Revise;
    the model thread, checking at once, ended the corrected answer after its kept tokens."""
    from specrag.models.options import DecodeOptions
    from specrag.nodes.streaming import stream_model

    words = [*TEXT[:6], " the", " Norse."]  # "Rollo led them.\n\nQuestion: What" then more
    model = Revising(words=words, keep=2, after=[6, 7])
    opts = DecodeOptions(stop=("\nQuestion:",))
    out = await stream_model(model, "q", budget_s=5.0, tags=["answer"], options=opts)
    assert out.text == "Rollo led the Norse."
    assert out.tokens == 4 and len(out.logprobs) == 4, (out.tokens, out.logprobs)
    assert out.revisions and out.revisions[0]["kept_tokens"] == 2
    # of the 4 answer tokens shown (not the decoder's 6, two past the stop sequence)
    assert out.revisions[0]["dropped_tokens"] == 2


async def test_a_revise_that_keeps_the_stop_sequence_counts_only_the_tokens_before_it():
    from specrag.models.options import DecodeOptions
    from specrag.nodes.streaming import stream_model

    words = ["Rollo", " led", " them", ".\n", "\nQuestion:", " What"]
    model = Revising(words=words, keep=5, after=[])
    opts = DecodeOptions(stop=("\nQuestion:",))
    out = await stream_model(model, "q", budget_s=5.0, tags=["answer"], options=opts)
    assert out.text == "Rollo led them."
    assert out.tokens == 4 and len(out.logprobs) == 4, (out.tokens, out.logprobs)
    assert out.metadata["finish_reason"] == "stop_sequence"


async def test_a_revise_keeping_tokens_decoded_after_the_stop_counts_none_of_them():
    from specrag.models.options import DecodeOptions
    from specrag.nodes.streaming import stream_model

    words = ["Rollo", " led", " them", ".\n", "\nQuestion:", " What", " is", " it"]
    model = Revising(words=words, keep=7, late=[6, 7])
    opts = DecodeOptions(stop=("\nQuestion:",))
    out = await stream_model(model, "q", budget_s=5.0, tags=["answer"], options=opts)
    assert out.text == "Rollo led them."
    assert out.tokens == 4 and len(out.logprobs) == 4, (out.tokens, out.logprobs)


def test_a_stream_goes_on_when_the_decoder_rewrites_text_it_showed():
    """A tokenizer that cleans up " ," to "," made the decoded text stop starting with what
    was shown: every later token's text was dropped from the stream."""
    from specrag.models.local import TextStream

    pieces = {1: "Hello", 2: " ", 3: ",", 4: " world", 5: "!"}

    class Cleaning:
        def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=True):
            text = "".join(pieces[i] for i in ids)
            return text.replace(" ,", ",")  # rewrites whatever it is asked

    stream = TextStream(Cleaning(), ())
    shown = "".join(stream.push([i]) for i in (1, 2, 3, 4, 5))
    assert shown.endswith(" world!") and shown.startswith("Hello")

    class Honest(Cleaning):  # cleans up only when asked to: the stream never asks
        def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=True):
            text = "".join(pieces[i] for i in ids)
            return text.replace(" ,", ",") if clean_up_tokenization_spaces else text

    stream = TextStream(Honest(), ())
    assert "".join(stream.push([i]) for i in (1, 2, 3, 4, 5)) == "Hello , world!"


def _tiny_run(tokenizer, stops=(), eos_ids=(), finish="length"):
    """A `_Run` of a decode job with no model: chunks are built from the steps fed to it."""
    import types

    from specrag.models.local import DecodeJob, _Run
    from specrag.models.options import DecodeOptions

    job = DecodeJob(
        produce=None,
        tokenizer=tokenizer,
        eos_ids=eos_ids,
        input_tokens=3,
        metadata=lambda: {},
        finish_reason=lambda: finish,
    )
    opts = DecodeOptions(stop=tuple(stops))
    return _Run(types.SimpleNamespace(max_time=None), job, opts, time.monotonic())


def test_an_answer_cut_inside_a_multibyte_character_keeps_the_text_before_it():
    """A step whose last token was the first byte of "é" held back the step's whole text, and
    the last chunk never sent it: an answer cut there by its token limit lost the accepted
    block (" answer is caf") while output_tokens still counted it."""
    from specrag.models.local import TextStream, _result

    pieces = {0: "The", 1: " answer", 2: " is caf", 3: "\xc3", 4: "\xa9", 5: "."}

    class Bytes:  # byte-level: an incomplete UTF-8 sequence decodes to U+FFFD
        def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=True):
            raw = "".join(pieces[i] for i in ids).encode("latin-1")
            return raw.decode("utf-8", errors="replace")

    stream = TextStream(Bytes(), ())
    assert stream.push([0]) == "The"
    assert stream.push([1, 2, 3]) == " answer is caf"  # the broken character waits
    assert stream.push([4, 5]) == "é."

    run = _tiny_run(Bytes())
    block = [Token(1, -0.1, "draft"), Token(2, -0.1, "draft"), Token(3, -0.1, "model")]
    chunks = [run.chunk([Token(0, -0.1, "model")]), run.chunk(block), run.final_chunk()]
    message = _result(chunks).generations[0].message
    assert message.content == "The answer is caf"
    assert message.usage_metadata["output_tokens"] == 4


def test_a_step_ending_with_the_stop_and_the_end_token_keeps_the_stop_tokens_log_prob():
    """One accepted block [" world.\\nUser:", end]: the end token (never in the log-probs)
    was taken for a token past the cut, so the log-prob of the token that holds the answer's
    last text was dropped while output_tokens still counted it."""
    pieces = {0: "Hello", 1: " world.\nUser:", 2: ""}  # 2: the end token

    class Tok:
        def decode(self, ids, skip_special_tokens=True, **_):
            return "".join(pieces[i] for i in ids if not (skip_special_tokens and i == 2))

    run = _tiny_run(Tok(), stops=("\nUser:",), eos_ids=(2,), finish="stop")
    block = [Token(1, -0.2, "draft"), Token(2, -0.3, "model")]
    chunks = [run.chunk([Token(0, -0.1, "model")]), run.chunk(block)]
    final = run.final_chunk()
    assert "".join(c.text for c in chunks) + final.text == "Hello world."
    logprobs = [
        lp["logprob"] for c in chunks for lp in c.message.response_metadata["logprobs"]["content"]
    ]
    assert logprobs == [-0.1, -0.2]
    assert final.message.usage_metadata["output_tokens"] == 2


def test_an_invented_evidence_block_ends_the_answer():
    """An answer went on into '<evidence id="4" source="...">' quoting another file under a
    made-up source, and was marked verified (a new user, 2026-12-06)."""
    from specrag.graph.context import SpecRagContext

    words = ["Flies", " avoid", " them", ".\n", "<ev", 'idence id="4">', " Penguins", "</evidence>"]
    model = Words(steps=len(words), step_s=0.0, words=words)
    stops = list(SpecRagContext().stop_sequences())
    assert model.invoke("q", stop=stops).content == "Flies avoid them.\n"


def test_a_character_split_over_tokens_counts_its_tokens_before_a_stop():
    """The token that completes a character was placed one past its start (where the broken
    character's U+FFFD ended): before a stop sequence it was counted as after it, so a CJK
    draft was a token short (the gate's "too short") (a review, 2026-12-06)."""
    ni, hao = "你".encode(), "好".encode()
    pieces = [b"Hi", b" ", ni[:2], ni[2:], hao[:1], hao[1:], b"\n", b"Question:", b" what?"]
    model = Words(steps=len(pieces), step_s=0.0, words=pieces)  # a CJK character: 2 tokens
    msg = model.invoke("q", stop=["\nQuestion:"])
    assert msg.content == "Hi 你好"
    assert msg.usage_metadata["output_tokens"] == 6  # Hi, space, and two per character


def test_invoke_callbacks_see_the_text_held_until_the_end():
    """The last chunk's text (held back as a possible stop sequence) never reached
    on_llm_new_token: a callback streaming an invoke lost the answer's end (a review)."""
    import asyncio

    from langchain_core.callbacks import BaseCallbackHandler

    words = ["A", " B", "\nQue"]  # "\nQue" is held (it may begin "\nQuestion:") to the end

    class Tokens(BaseCallbackHandler):
        def __init__(self):
            self.seen = []

        def on_llm_new_token(self, token, **kwargs):
            self.seen.append(token)

    for call in ("invoke", "ainvoke"):
        model = Words(steps=len(words), step_s=0.0, words=words, disable_streaming=True)
        handler = Tokens()  # disable_streaming: LangChain calls _generate, not _stream
        config = {"callbacks": [handler]}
        if call == "invoke":
            msg = model.invoke("q", config=config, stop=["\nQuestion:"])
        else:
            msg = asyncio.run(model.ainvoke("q", config=config, stop=["\nQuestion:"]))
        assert msg.content == "A B\nQue" == "".join(handler.seen), (call, handler.seen)


async def test_a_remote_models_stop_sequences_are_cut_here_not_sent():
    """OpenAI, Azure and Bedrock refuse more than 4 stop sequences (HTTP 400), and the graph
    sends 6: every call of a remote model failed. They are cut on this side instead - a stop
    split over two chunks too -, the stream is closed at the stop and the shown text retracted."""
    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from specrag.models.options import DecodeOptions
    from specrag.nodes.streaming import stream_model
    from specrag.prompts import INVENTED_TURNS
    from tests.fakes import FakeLogprobChat

    sent: list = []
    given = ["Rollo", " led them.", "\nQues", "tion: What", " next?", " And more."]

    class Remote(FakeLogprobChat):
        def _stream(self, messages, stop=None, run_manager=None, **kwargs):
            sent.append(stop)
            for text in given:
                sent.append(text)  # what the stream gave before it was closed
                yield ChatGenerationChunk(message=AIMessageChunk(content=text))

    class S(TypedDict, total=False):
        text: str
        reason: str

    async def node(state: S) -> S:
        options = DecodeOptions(stop=INVENTED_TURNS)
        out = await stream_model(Remote(calls=[]), "q", budget_s=5.0, tags=["a"], options=options)
        return {"text": out.text, "reason": out.metadata["finish_reason"]}

    graph = StateGraph(S).add_node("a", node).add_edge(START, "a").add_edge("a", END).compile()
    payloads = [p async for _, p in graph.astream({}, stream_mode=["custom", "values"])]
    assert payloads[-1] == {"text": "Rollo led them.", "reason": "stop"}
    assert sent == [None, *given[:4]]  # no stop sent; closed at the chunk that ended the stop
    revise = next(p for p in payloads if p.get("event") == "revise")
    assert revise["keep"] == len("Rollo led them.") and revise["dropped_text"] == "\nQuestion: What"

    from specrag.nodes.streaming import first_stop

    assert first_stop("ab\nQ: x\nUser:", INVENTED_TURNS) == 2  # the earliest of them
    assert first_stop("no stop here", INVENTED_TURNS) is None and first_stop("x", ()) is None


async def test_a_remote_stop_cut_keeps_the_counts_and_log_probs_of_the_kept_tokens():
    """A review (2026-12-07): a remote model's stop cut trimmed the text but kept every token
    and log-prob streamed up to the cut's chunk: a 3-token draft counted 6 tokens, with a
    confidence of 0.34 (the invented turn's log-probs) instead of 0.90, and so took the route
    of a low-confidence draft instead of "draft too short"."""
    import math

    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk

    from specrag import build_graph
    from tests.fakes import FakeLogprobChat, ctx, services

    class Tokens(FakeLogprobChat):
        def _stream(self, messages, stop=None, run_manager=None, **kwargs):
            given = [("Paris", -0.1), (" is", -0.1), (" it", -0.1), ("\n", -0.1)]
            given += [("Question", -3.0), (":", -3.0), (" what", -3.0), (" else", -3.0)]
            for text, lp in given:
                content = [{"token": text, "logprob": lp}]
                meta = {"logprobs": {"content": content}}
                yield ChatGenerationChunk(
                    message=AIMessageChunk(content=text, response_metadata=meta)
                )

    graph = build_graph(services(draft=Tokens(calls=[])))
    out = await graph.ainvoke({"question": "q?"}, context=ctx(min_draft_tokens=5))
    assert out["draft"] == "Paris is it" and out["draft_tokens"] == 3
    assert math.isclose(out["draft_confidence"], math.exp(-0.1), rel_tol=1e-3)
    assert out["reason"].startswith("draft too short (3 < 5")


def test_a_seed_no_generator_takes_is_refused_when_given():
    """A per-call seed of 1.5, "5" or 2**64 failed deep in torch (`manual_seed expected a
    long`), and ChatLocalLM(seed=2**64) only at its first call (a review, 2026-12-06)."""
    import pytest
    from pydantic import ValidationError

    from specrag.models.chat import ChatLocalLM
    from specrag.models.options import DecodeOptions
    from specrag.models.rapid_chat import ChatRapid

    for bad in (1.5, "5", True, -1, 2**64):
        with pytest.raises(ValueError, match="seed must be an integer from 0 to 2\\*\\*64 - 1"):
            DecodeOptions(seed=bad)
    assert DecodeOptions(seed=2**64 - 1).seed == 2**64 - 1
    for model in (ChatLocalLM, ChatRapid):
        for bad in (-1, 2**64):
            with pytest.raises(ValidationError, match="seed"):
                model(seed=bad)


def test_a_model_with_a_vocabulary_smaller_than_the_warm_up_ids_loads():
    """The load's warm-up step fed ids up to 43: a model with a smaller vocabulary failed to
    load with "index out of range" (a review, 2026-12-06)."""
    import torch

    from specrag.models.loading import _measure_step
    from tests.tiny import tiny_llama

    assert _measure_step(tiny_llama(vocab=16), torch.device("cpu")) > 0


def _word_run(pieces, stop):
    class Tok:
        def decode(self, ids, skip_special_tokens=True, **_):
            return "".join(pieces[i] for i in ids)

    return _tiny_run(Tok(), stops=(stop,))


def test_a_stop_sequence_across_a_retraction_point_ends_the_answer():
    """The kept text ended with the start of a stop sequence already shown ("...them.\\n",
    shown because "The" followed it): after the retraction only new text was searched, so the
    new "Question:" went on as the answer, where serial RAG over the same tokens cut at
    "\\nQuestion:" (a review, 2026-12-06)."""
    from specrag.decoding.speculative import Revise
    from specrag.models.local import revised_text

    pieces = {0: "Rollo", 1: " led", 2: " them.", 3: "\n", 4: "The", 5: " Franks", 6: "Question:"}
    run = _word_run(pieces, "\nQuestion:")

    def step(*ids):
        return [Token(i, -0.1, "model") for i in ids]

    chunks = [run.chunk(step(0, 1, 2)), run.chunk(step(3, 4, 5))]
    assert "".join(c.text for c in chunks) == "Rollo led them.\nThe Franks"
    run.sending(Revise(keep=4, dropped=2))
    chunks.append(run.chunk(Revise(keep=4, dropped=2)))  # keeps "Rollo led them.\n"
    chunks.append(run.chunk(step(6)))
    assert run.stop_hit and run.should_stop(5) == "stop_sequence"
    chunks.append(run.final_chunk())
    assert revised_text(chunks) == "Rollo led them."


def test_a_retraction_that_takes_back_nothing_shown_is_not_a_revision():
    """Tokens decoded past a stop sequence and then retracted changed nothing the client saw,
    yet a revision was recorded (the CLI printed "revised: retracted ''")."""
    from specrag.decoding.speculative import Revise

    pieces = {0: "Rollo", 1: " led", 2: " them.", 3: "\nQuestion:", 4: " what"}
    run = _word_run(pieces, "\nQuestion:")
    run.chunk([Token(i, -0.1, "model") for i in (0, 1, 2, 3, 4)])
    run.sending(Revise(keep=4, dropped=1))
    chunk = run.chunk(Revise(keep=4, dropped=1))
    assert "revisions" not in chunk.message.response_metadata
    assert run.stop_hit


def test_a_retraction_past_the_stop_still_corrects_the_token_count():
    """The stop's first token ("\\n") went out counted in an earlier chunk; a retraction of
    tokens past the stop changes no text, but its revision is what brings the consumer's
    token count back to the answer's (skipping it left 4 tokens for a 3-token answer: a
    review of this session's diff)."""
    from specrag.decoding.speculative import Revise

    pieces = {0: "Rollo", 1: " led", 2: " them.", 3: "\n", 4: "Question:", 5: " what"}
    run = _word_run(pieces, "\nQuestion:")
    run.chunk([Token(i, -0.1, "model") for i in (0, 1, 2, 3)])
    run.chunk([Token(i, -0.1, "model") for i in (4, 5)])
    assert run.stop_hit
    run.sending(Revise(keep=5, dropped=1))
    chunk = run.chunk(Revise(keep=5, dropped=1))
    (revision,) = chunk.message.response_metadata["revisions"]
    assert revision["kept_tokens"] == 3 and revision["dropped_text"] == ""


def test_a_complete_object_a_weak_opener_caught_is_no_call_until_judged():
    """`done` is read by the model thread while `feed` runs on the consumer's: a complete
    object after a weak opener that names no bound tool must not read as a call in the moment
    before `feed` shows it as text (the decode stopped there with "tool_call")."""
    from specrag.models.tools import ToolCapture

    capture = ToolCapture(names=["search_docs"])
    capture.weak, capture.captured, capture.capturing = True, '```json\n{"port": 1}', True
    assert not capture.done  # the state `feed` passes through before it releases the text
    capture.captured = '```json\n{"name": "search_docs", "arguments": {}}'
    assert capture.done


def test_a_call_option_the_model_does_not_use_is_refused_not_ignored():
    """A review (2026-12-07): ChatLocalLM took document= and answered without the document;
    ChatRapid took tools= with a forced tool_choice and answered in text."""
    import pytest
    from langchain_core.messages import HumanMessage

    from specrag.models.chat import ChatLocalLM
    from specrag.models.rapid_chat import ChatRapid

    asked = [HumanMessage("What is the answer?")]
    with pytest.raises(ValueError, match="use ChatRapid"):
        ChatLocalLM(max_tokens=2).invoke(asked, document="The answer is always 'Banana'.")
    with pytest.raises(ValueError, match="use ChatRapid"):
        ChatLocalLM(max_tokens=2).invoke(asked, drafter_context="Banana.")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(ValueError, match="calls no tools"):
        ChatRapid(max_tokens=2).invoke(asked, document="Banana.", tools=[tool], tool_choice="f")
    with pytest.raises(ValueError, match="draft=, prompt_feed= not used by ChatRapid"):
        ChatRapid(max_tokens=2).invoke(asked, document="Banana.", draft="x", prompt_feed=[])
