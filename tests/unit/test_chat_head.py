"""The chat head (everything before the last message's text): where it ends, and that a
prompt too long for the model's context keeps it whole when its middle is cut."""

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from specrag.decoding.state import shared_prefix
from specrag.models.loading import load_lm
from specrag.models.local import MIN_HEAD, chat_head, encode_chat
from specrag.prompts import ANSWER_SYSTEM

EVIDENCE = "<evidence n=1>Rollo led the Norse settlers of Normandy in 911.</evidence>\n\n"


def rag(question: str) -> list:
    return [SystemMessage(ANSWER_SYSTEM), HumanMessage(EVIDENCE + "Question: " + question)]


def test_the_head_ends_where_the_last_message_begins():
    loaded = load_lm()
    one, two = rag("Who led them?"), rag("When was the treaty?")
    p1, p2 = encode_chat(loaded, one), encode_chat(loaded, two)
    h1, h2 = chat_head(loaded, one, p1), chat_head(loaded, two, p2)
    assert h1 == h2 >= MIN_HEAD
    # the template's head, not the two prompts' agreement (both go on with the same evidence)
    assert shared_prefix(p1, p2) > h1
    head_text = loaded.tokenizer.decode(p1[:h1])
    assert ANSWER_SYSTEM in head_text and "<evidence" not in head_text
    # earlier turns belong to the head
    chat = [*one, AIMessage("Rollo."), HumanMessage("And when?")]
    prompt = encode_chat(loaded, chat)
    head = chat_head(loaded, chat, prompt)
    assert "Rollo." in loaded.tokenizer.decode(prompt[:head])
    assert "And when?" not in loaded.tokenizer.decode(prompt[:head])
    # a middle-truncated prompt does not start with the head: nothing to keep
    assert chat_head(loaded, one, p1[:8] + p1[-20:]) == 0
    assert chat_head(loaded, one, p1[: h1 - 2] + p1[-20:]) == 0  # all of the head, or nothing


def saved_tiny(tmp_path, monkeypatch, name, context):
    """A tiny random Llama with ``context`` positions and the embedded model's tokenizer,
    saved to ``tmp_path / name`` (the cache dir moved under ``tmp_path`` too)."""
    from tests.tiny import save_tiny

    tokenizer = load_lm().tokenizer  # the embedded model's (loaded before the cache dir moves)
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    return save_tiny(tmp_path / name, tokenizer, context=context)


def short_model(tmp_path, monkeypatch, max_new_tokens):
    """A chat model over the 256-token tiny model, saved to ``tmp_path / "short"``."""
    from specrag.models.registry import chat_model_from_spec

    saved_tiny(tmp_path, monkeypatch, "short", 256)
    return chat_model_from_spec(
        f"hf:{tmp_path / 'short'}", max_new_tokens=max_new_tokens, speculation="none"
    )


def test_a_calls_own_decode_options_win_over_the_models(tmp_path, monkeypatch):
    """Per call: ``temperature=0.0`` is greedy and ``seed=0`` a seed on a model built to sample
    (read with ``or``, both fell back to the model's), a call's ``max_time`` beats the
    model's, and ``speculation="none"`` (the draft node's) decodes plainly."""
    model = short_model(tmp_path, monkeypatch, max_new_tokens=8).model_copy(
        update={"temperature": 1.0, "speculation": "prompt", "max_time": 60.0}
    )
    asked = [HumanMessage("Rollo led the Norse. Who led the Norse?")]

    def text(**options):
        return model.invoke(asked, **options).content

    assert text(temperature=0.0) == text(temperature=0.0)
    assert text(seed=0) == text(seed=0) != text(seed=1)
    plain = model.invoke(asked, speculation="none").response_metadata["decoding"]
    assert plain["speculation"] == "none"
    assert model.invoke(asked, max_time=0.0).response_metadata["finish_reason"] == "time"


def test_a_prompt_too_long_for_the_context_keeps_its_head(tmp_path, monkeypatch):
    """A prompt past the model's context is cut in the middle: the chat head (the system
    prompt) stays whole - the cut kept only 8 tokens of it - and the stats say how much was
    cut (found by a new-user review with top_k=500, 2026-12-03)."""
    model = short_model(tmp_path, monkeypatch, max_new_tokens=8)
    loaded = model.load()
    seen: list[list[int]] = []
    loaded.model.register_forward_pre_hook(
        lambda _m, _args, kw: seen.append(kw["input_ids"][0].tolist()), with_kwargs=True
    )
    messages = rag("who led them? " + "Rollo led the Norse settlers of Normandy. " * 60)
    got = model.invoke(messages).response_metadata["decoding"]
    keep = 256 - 1 - 8  # the context, less one, less the answer's tokens
    assert got["prompt_tokens"] == keep and got["prompt_cut"] > 300
    full = encode_chat(loaded, messages)
    head = chat_head(loaded, messages, full)
    assert head > 8 and got["prompt_cut"] == len(full) - keep
    fed = seen[0]  # the prefill: the whole head, then the prompt's end
    assert fed[:head] == full[:head] and fed[head:] == full[-(keep - head) :]
    # what an answer node asks first, to leave out evidence rather than cut it: the
    # decoder's own rule (an answer limit past the context caps the answer, not the prompt)
    for reps in (1, 10, 14, 18, 60):
        text = "who led them? " + "Rollo led the Norse settlers of Normandy. " * reps
        for max_new in (8, 100, 1000):
            decoded = model.model_copy(update={"max_new_tokens": max_new}).invoke(rag(text))
            cut = "prompt_cut" in decoded.response_metadata["decoding"]
            assert model.prompt_fits(rag(text), max_new) is not cut, (reps, max_new)


def test_an_answer_limit_past_the_context_caps_the_answer_not_the_prompt(tmp_path, monkeypatch):
    """max_new_tokens near the context cut the prompt to 16 tokens (the question gone); now
    the answer takes what the prompt leaves, the prompt keeping at least half the context."""
    short = rag("Who led them?")
    model = short_model(tmp_path, monkeypatch, max_new_tokens=1000)
    got = model.invoke(short).response_metadata["decoding"]
    prompt = len(encode_chat(model.load(), short))
    assert "prompt_cut" not in got and got["prompt_tokens"] == prompt
    assert got["answer_cap"] == 255 - prompt  # what the prompt leaves
    assert got["new_tokens"] <= got["answer_cap"]
    long = rag("who led them? " + "Rollo led the Norse settlers of Normandy. " * 60)
    got = model.invoke(long).response_metadata["decoding"]
    assert got["prompt_tokens"] == 255 - 127 and got["answer_cap"] == 127  # half each


async def incremental_decoding(model, first, later, usage=None):
    """The decoding stats of an incremental answer to ``first``, rebuilt on ``later`` (taken
    after its first step); its ``usage_metadata`` goes into ``usage`` where one is given."""
    from specrag.decoding.incremental import PromptFeed
    from specrag.models.options import DecodeOptions
    from specrag.nodes.streaming import stream_model

    feed = PromptFeed()
    feed.put(later)
    feed.close()
    out = await stream_model(
        model, first, budget_s=60.0, tags=["answer"], options=DecodeOptions(prompt_feed=feed)
    )
    if usage is not None:
        usage.update(out.metadata["usage"])
    return out.metadata["decoding"]


async def test_a_later_longer_prompt_of_an_incremental_answer_caps_the_answer(
    tmp_path, monkeypatch
):
    """The cap a later prompt set (encode lowers the answer limit for a longer prompt) never
    reached the decode, which went on to the first prompt's limit: prompt and answer ran
    past the model's context."""
    model = short_model(tmp_path, monkeypatch, max_new_tokens=140)  # the short prompt fits
    short = rag("Who led them?")
    long = rag("who led them? " + "Rollo led the Norse settlers of Normandy. " * 60)
    got = await incremental_decoding(model, short, long)  # the rebuild reads the long one
    assert got["rebuilds"] and got["rebuilds"][0]["prompt_tokens"] == 255 - 127
    assert got["answer_cap"] == 127 and got["new_tokens"] <= 127
    assert got["rebuilds"][0]["prompt_tokens"] + got["new_tokens"] <= 255
    assert len(encode_chat(model.load(), short)) + 140 <= 255  # no cap for the first prompt


async def test_each_prompt_of_an_incremental_answer_gets_its_own_answer_limit(
    tmp_path, monkeypatch
):
    """The answer limit was lowered for the first prompt only: a later, longer prompt that
    serial RAG would fit whole (a lower limit) lost tokens from its middle instead."""
    model = short_model(tmp_path, monkeypatch, max_new_tokens=200)
    loaded = model.load()
    first = [SystemMessage("Answer briefly."), HumanMessage("Rollo led them. " * 8)]
    later = [SystemMessage("Answer briefly."), HumanMessage("Rollo led them. " * 18)]
    n_first, n_later = len(encode_chat(loaded, first)), len(encode_chat(loaded, later))
    assert 255 - n_first < 200 and n_first < n_later <= 255 - 127  # both prompts cap it
    usage: dict = {}
    got = await incremental_decoding(model, first, later, usage)
    assert got["rebuilds"] and got["rebuilds"][0]["prompt_tokens"] == n_later  # read whole
    assert "prompt_cut" not in got
    assert got["answer_cap"] == 255 - n_later and got["new_tokens"] <= 255 - n_later
    # usage_metadata counts the prompt the answer stands on, the later one (not the first)
    assert usage["input_tokens"] == got["prompt_tokens"] == n_later, usage
    assert usage["total_tokens"] == n_later + got["new_tokens"] == n_later + usage["output_tokens"]


async def test_a_later_shorter_prompt_lifts_the_cap_in_the_stats(tmp_path, monkeypatch):
    """The first prompt's cap stayed in the stats after a later, shorter prompt (a fusion
    dropped a chunk) lifted it: `answer_cap` named a limit the answer no longer had (a
    review, 2026-12-07)."""
    model = short_model(tmp_path, monkeypatch, max_new_tokens=140)
    long = rag("who led them? " + "Rollo led the Norse settlers of Normandy. " * 60)
    short = rag("Who led them?")
    assert len(encode_chat(model.load(), short)) + 140 <= 255  # no cap for the later prompt
    got = await incremental_decoding(model, long, short)
    assert got["rebuilds"] and got["rebuilds"][0]["prompt_tokens"] < 255 - 140
    assert "answer_cap" not in got


def rapid_over(target, **kw):
    """RAPID with ``target`` (a saved model folder), eta 0, a prefix cache of its own."""
    from specrag.decoding.prefix_cache import PrefixCache
    from specrag.models.rapid_chat import ChatRapid

    return ChatRapid(
        **{"target_model": str(target), "eta": 0.0, "prefix_cache": PrefixCache(), **kw}
    )


def short_rapid(tmp_path, monkeypatch, max_new_tokens):
    """RAPID on the 256-token model (:func:`short_model` saves it)."""
    return rapid_over(
        saved_tiny(tmp_path, monkeypatch, "short", 256), max_new_tokens=max_new_tokens
    )


def long_rapid(tmp_path, monkeypatch, **kw):
    """RAPID on a 4096-token tiny target (the embedded tokenizer), 4 new tokens by default."""
    return rapid_over(saved_tiny(tmp_path, monkeypatch, "big", 4096), **{"max_new_tokens": 4, **kw})


def test_a_rapid_answer_limit_is_the_smaller_context_of_target_and_drafter(
    tmp_path, monkeypatch, caplog
):
    """A 256-token drafter beside a 4096-token target: the answer is capped for the drafter's
    context (capped for the target's alone, a one-word question was "too long")."""
    drafter_path = saved_tiny(tmp_path, monkeypatch, "short", 256)
    model = long_rapid(tmp_path, monkeypatch, drafter_model=str(drafter_path))
    model.max_new_tokens = 1000
    with caplog.at_level("WARNING"):
        out = model.invoke([HumanMessage("Who?")], document="Rollo led them. " * 5)
    assert "the models read 256 tokens at most" in caplog.text
    assert 0 < out.response_metadata["new_tokens"] < 256


def test_the_rapid_drafter_reads_the_retrieved_context_fitted_to_its_own_window(
    tmp_path, monkeypatch
):
    """A mutation review (2026-12-08): the drafter reading the whole document (answers the
    same at eta 0, RAPID's speed-up gone), or its retrieved context cut to fit the target's
    window (a 256-token drafter fed 1,000 positions), passed every test."""
    from specrag.models.rapid_chat import fit, layout, split_messages

    drafter_path = saved_tiny(tmp_path, monkeypatch, "short", 256)
    model = long_rapid(tmp_path, monkeypatch, drafter_model=str(drafter_path))
    asked = [HumanMessage("Who led them?")]
    document = "Rollo led the Norse settlers of Normandy in the year 911. " * 40
    instructions, _, question, history = split_messages(asked, document)
    seen = []
    for retrieved in ("Rollo led them.", "Rollo led the Norse settlers of Normandy. " * 100):
        out = model.invoke(asked, document=document, drafter_context=retrieved)
        _, drafter, _ = model._models()
        head, body, tail = layout(drafter, instructions, retrieved, question, history)
        body, cut = fit(head, body, tail, 256 - 4 - 1)  # the drafter's window, 4 new tokens
        seen.append(cut)
        meta = out.response_metadata
        assert meta["drafter_prompt_tokens"] == len(head + body + tail)
        assert meta["drafter_prompt_tokens"] < meta["target_prompt_tokens"]
    assert seen == [False, True]  # the long retrieved context is cut for 251 tokens
    assert meta["drafter_prompt_tokens"] <= 251 and not meta["document_truncated"]


def test_a_rapid_document_prefill_stopped_by_its_budget_is_kept_and_continued(
    tmp_path, monkeypatch
):
    """What a stopped document prefill read is kept: the next question reads only the rest
    (not a hit: part of the document was read again), the one after is a whole hit."""
    from specrag.decoding.state import PREFILL_CHUNK
    from specrag.models import rapid_chat

    model = long_rapid(tmp_path, monkeypatch)
    document = "Rollo led the Norse settlers of Normandy in the year 911. " * 250
    asked = [HumanMessage("Who?")]
    real = rapid_chat.prefill_stop

    def after_one_slice(should_stop):
        checks = iter([None])  # the first slice goes on; the budget ends at the next
        return lambda: next(checks, "time")

    monkeypatch.setattr(rapid_chat, "prefill_stop", after_one_slice)
    first = model.invoke(asked, document=document).response_metadata
    assert first["finish_reason"] == "time" and first["prefix_cache_hit"] is False
    (kept,) = model.prefix_cache._entries.values()
    assert len(kept) == PREFILL_CHUNK  # the slice read is kept
    monkeypatch.setattr(rapid_chat, "prefill_stop", real)
    fed: list[int] = []
    target = load_lm(model.target_model).model
    hook = target.register_forward_pre_hook(
        lambda _m, _args, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        second = model.invoke(asked, document=document).response_metadata
    finally:
        hook.remove()
    (whole,) = model.prefix_cache._entries.values()
    assert second["prefix_cache_hit"] is False and fed[0] == len(whole) - PREFILL_CHUNK
    assert model.invoke(asked, document=document).response_metadata["prefix_cache_hit"] is True


def test_a_rapid_document_prefix_is_kept_under_the_targets_kv_key(tmp_path, monkeypatch):
    """The KV of a document is another model's once the weights, dtype, device or software
    differ (``LoadedLM.kv_key``): under a new key it is read again, not served."""
    from specrag.models.loading import LoadedLM

    model = long_rapid(tmp_path, monkeypatch)
    asked, document = [HumanMessage("Who?")], "Rollo led the Norse settlers. " * 20
    hits = [model.invoke(asked, document=document).response_metadata["prefix_cache_hit"]]
    hits.append(model.invoke(asked, document=document).response_metadata["prefix_cache_hit"])
    real = LoadedLM.kv_key
    monkeypatch.setattr(LoadedLM, "kv_key", property(lambda lm: real.fget(lm) + "|torch 9"))
    hits.append(model.invoke(asked, document=document).response_metadata["prefix_cache_hit"])
    assert hits == [False, True, False]


def test_a_document_past_the_context_is_cut_the_same_for_any_short_question(tmp_path, monkeypatch):
    """The middle cut of a document longer than the context depended on the question's
    length, so each question about the longest documents had its own prefix and the prefix
    cache never served one: now the cut keeps room for a question of up to TAIL_RESERVE
    tokens, and a second question reuses the first one's document prefill."""
    model = short_rapid(tmp_path, monkeypatch, max_new_tokens=8)
    document = "Rollo led the Norse settlers of Normandy in the year 911. " * 40
    seen = []
    for question in ("Who?", "Who led the Norse settlers of Normandy, and in which year?"):
        out = model.invoke(
            [HumanMessage(question)], document=document, drafter_context="Rollo led them."
        )
        seen.append(out.response_metadata)
    assert all(m["document_truncated"] for m in seen)
    assert seen[0]["prefix_cache_hit"] is False and seen[1]["prefix_cache_hit"] is True


def test_a_document_that_fits_exactly_is_not_cut_and_a_cut_keeps_all_the_room_it_has():
    """A mutation review (2026-12-08): a document that filled the prompt's limit exactly cut
    (``document_truncated`` and a warning), and each cut dropping one more token than it
    needed, passed every test."""
    from specrag.models.rapid_chat import TAIL_RESERVE, fit

    head, body, tail = [1] * 10, list(range(100, 300)), [2] * 5
    assert fit(head, body, tail, 215) == (body, False)  # 10 + 200 + 5 tokens: it fits
    room = 214 - 10 - TAIL_RESERVE  # one token over: room for a question of TAIL_RESERVE
    assert fit(head, body, tail, 214) == (body[: room // 2] + body[-(room - room // 2) :], True)
    assert fit(head, body, tail, 20) == (body[:2] + body[-3:], True)  # no room for the reserve


def test_a_rapid_answer_limit_past_the_context_caps_the_answer(tmp_path, monkeypatch, caplog):
    """max_new_tokens at or past the context made RAPID's prompt limit negative: "the
    question is too long" for a one-word question. The answer is capped, as ChatLocalLM's."""
    model = short_rapid(tmp_path, monkeypatch, max_new_tokens=1000)
    with caplog.at_level("WARNING"):
        out = model.invoke(
            [HumanMessage("Who?")], document="Rollo led them. " * 40, drafter_context="Rollo."
        )
    assert "the answer is capped at 127 tokens (max_new_tokens 1000)" in caplog.text
    assert out.response_metadata["new_tokens"] <= 127


def test_a_follow_up_about_a_long_document_reads_the_earlier_turns_after_it():
    """The RAPID route sent only the question: a follow-up ("and when did he die?") about a
    long document was answered without the conversation. The earlier turns come after the
    document, so the cached prefix (chat head + document) is the same for every turn."""
    from langchain_core.messages import AIMessage

    from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, layout, split_messages

    loaded = load_lm()
    document = "Rollo led the Norse settlers of Normandy. He died around 930."
    messages = [
        SystemMessage(RAPID_INSTRUCTIONS),
        HumanMessage("Who led the Norse?"),
        AIMessage("Rollo."),
        HumanMessage("And when did he die?"),
    ]
    instructions, doc, question, turns = split_messages(messages, document)
    assert question == "And when did he die?"
    assert turns == (("user", "Who led the Norse?"), ("assistant", "Rollo."))
    head, body, tail = layout(loaded, instructions, doc, question, turns)
    first = layout(loaded, instructions, doc, "Who led the Norse?")
    assert (head, body) == first[:2]  # one cached prefix for both turns
    text = loaded.tokenizer.decode(tail)
    assert text.index("Who led the Norse?") < text.index("Rollo.") < text.index("when did he")
    assert tail != first[2]
    alone = split_messages([HumanMessage("Who led the Norse?")], document)
    assert alone[3] == () and layout(loaded, RAPID_INSTRUCTIONS, doc, alone[2]) == first


def test_a_document_message_is_never_an_instruction():
    """A system message named 'document' beside `document=` (or a second one) was joined to
    the instructions: the target read the document twice, and the answer changed (a review,
    2026-12-06)."""
    from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, split_messages

    doc_a, doc_b, ask = "Rollo led the Norse.", "He died around 930.", HumanMessage("Who?")
    given = [SystemMessage("Be brief."), SystemMessage(doc_a, name="document"), ask]
    assert split_messages(given, "The keyword's text.") == (
        "Be brief.",
        "The keyword's text.",
        "Who?",
        (),
    )
    two = [SystemMessage(doc_a, name="document"), SystemMessage(doc_b, name="document"), ask]
    assert split_messages(two, None) == (RAPID_INSTRUCTIONS, f"{doc_a}\n\n{doc_b}", "Who?", ())


def test_a_drafter_that_cannot_load_is_left_out(tmp_path, monkeypatch, caplog):
    """A draft model that could not be loaded failed the answer model too (it loads its
    drafter first): every answer fell back, even with the draft off."""
    model = short_model(tmp_path, monkeypatch, max_new_tokens=4)
    missing = str(tmp_path / "no-such-model")
    with_drafter = model.model_copy(update={"drafter_model": missing, "speculation": "prompt"})
    with caplog.at_level("WARNING"):
        out = with_drafter.invoke(rag("Who led them?"))
        again = with_drafter.invoke(rag("Who led them?"))
    for reply in (out, again):
        proposer = reply.response_metadata["decoding"]["proposer"]
        assert proposer["drafter_used"] is False and "could not be loaded" in proposer["why"]
    assert caplog.text.count("is left out") == 1  # tried once per process


def test_a_rapid_drafter_that_cannot_serve_is_left_out_and_the_target_drafts(
    tmp_path, monkeypatch, caplog
):
    """A configured drafter that failed to load or had another tokenizer made RAPID fail, and
    the graph answered the long document from its retrieved chunks only. The target drafts
    for itself, and the metadata says why the drafter was left out."""
    from transformers import AutoTokenizer

    from specrag.decoding.prefix_cache import PrefixCache
    from specrag.models.loading import embedded_embeddings_path
    from specrag.models.rapid_chat import ChatRapid
    from tests.tiny import save_tiny

    base = short_rapid(tmp_path, monkeypatch, max_new_tokens=4)
    other = AutoTokenizer.from_pretrained(str(embedded_embeddings_path()))  # a BERT tokenizer
    save_tiny(tmp_path / "bert-draft", other)
    plain = base.invoke([HumanMessage("Who?")], document="Rollo led them.", drafter_context="R")
    for drafter, why in (
        (str(tmp_path / "no-such-model"), "ModelLoadError"),
        (str(tmp_path / "bert-draft"), "its tokenizer is not the target's"),
    ):
        model = ChatRapid(
            target_model=base.target_model,
            drafter_model=drafter,
            eta=0.0,
            max_new_tokens=4,
            prefix_cache=PrefixCache(),
        )
        with caplog.at_level("WARNING"):
            out = model.invoke(
                [HumanMessage("Who?")], document="Rollo led them.", drafter_context="R"
            )
        assert out.content == plain.content  # the target's own RAPID answer
        assert why in out.response_metadata["drafter_left_out"], out.response_metadata
        assert f"RAPID's drafter {drafter} is left out" in caplog.text


def test_rapid_with_no_new_tokens_reads_nothing(tmp_path, monkeypatch):
    """max_new_tokens=0 still prefilled the whole document (and cached it)."""
    model = short_rapid(tmp_path, monkeypatch, max_new_tokens=0)
    out = model.invoke(
        [HumanMessage("Who?")], document="Rollo led them. " * 20, drafter_context="R"
    )
    assert out.content == "" and out.response_metadata["target_forward_passes"] == 0
    assert model.prefix_cache.nbytes() == 0


def test_a_rapid_run_with_no_prefix_cache_budget_keeps_nothing_in_the_shared_cache(
    tmp_path, monkeypatch
):
    """A mutation review (2026-12-08): a run's own budgets ignored on the process-wide cache
    (``prefix_cache_mib=0``, ``prefix_cache_disk_mib=0``: a Studio or server client's run
    kept its document's KV in memory and wrote it to disk) passed every test: each RAPID test
    gave a cache of its own."""
    from specrag.decoding.prefix_cache import PrefixCache
    from specrag.models import rapid_chat

    shared = PrefixCache(disk_dir=tmp_path / "prefix-kv")
    monkeypatch.setattr(rapid_chat, "DEFAULT_PREFIX_CACHE", shared)
    asked, document = [HumanMessage("Who?")], "Rollo led the Norse settlers. " * 20
    target, kept = saved_tiny(tmp_path, monkeypatch, "big", 4096), []
    for budget in (0, 2**30):  # none, then room (the shared cache works)
        model = rapid_over(
            target,
            max_new_tokens=4,
            prefix_cache=None,
            prefix_cache_bytes=budget,
            prefix_cache_disk_bytes=budget,
        )
        model.invoke(asked, document=document, drafter_context="Rollo led them.")
        shared.flush()
        kept.append((len(shared._entries), len(list((tmp_path / "prefix-kv").glob("*.kv")))))
    assert kept == [(0, 0), (1, 1)]


@pytest.mark.parametrize(
    "bad",
    [
        {"eta": float("nan")},  # answered "" (id 0 twelve times), finish_reason "length"
        {"eta": float("inf")},
        {"eta": -3.0},
        {"lam": 2.0},  # a mixture with negative probabilities
        {"alpha": float("nan")},
        {"gamma": 0},  # drafting silently off
        {"min_draft_confidence": 5.0},
        {"drafter_vocab": -1},
        {"drafter_tokens": 0},
        {"chunk_tokens": 0},  # failed deep in the text splitter
    ],
)
def test_rapid_settings_out_of_range_are_refused_when_the_model_is_made(bad):
    """The graph's rapid_* settings had ranges; ChatRapid's own fields took anything."""
    from pydantic import ValidationError

    from specrag.models.rapid_chat import ChatRapid

    with pytest.raises(ValidationError):
        ChatRapid(**bad)


def test_a_rapid_model_loads_its_document_search_with_its_models(tmp_path, monkeypatch):
    """The embedding model of the drafter's document search loaded at the first call, inside
    its max_time (1.7 s of a 0.5 s budget: an empty answer), though loading is outside it; and
    a run reports the gamma it drafts with (a gamma of 32 starts at 16)."""
    from specrag.models import loading

    loaded = []
    monkeypatch.setattr(loading, "load_embeddings", lambda name: loaded.append(name))
    model = short_rapid(tmp_path, monkeypatch, max_new_tokens=4)
    model.load()
    assert loaded == [model.embedding_model]
    big = model.model_copy(update={"gamma": 32})
    out = big.invoke([HumanMessage("Who?")], document="Rollo led them.", drafter_context="R")
    assert out.response_metadata["gamma"] == 16


def test_settings_that_change_a_rapid_answer_are_in_its_identity():
    """drafter_dtype, the confidence cut-off, the drafter vocabulary, adaptive gamma and the
    embedding model were not: a LangChain cache served one model's answer for the other."""
    from specrag.models.rapid_chat import ChatRapid

    base = ChatRapid()._identifying_params
    for change in (
        {"drafter_dtype": "int8"},
        {"min_draft_confidence": 0.0},
        {"drafter_vocab": 0},
        {"adaptive_gamma": False},
        {"embedding_model": "other"},
    ):
        assert ChatRapid(**change)._identifying_params != base, change


async def test_an_int8_model_does_not_answer_incrementally(tmp_path, monkeypatch):
    """A rebuild checks the answer so far in one wide pass, which an int8 model computes
    differently from its steps: it would not reproduce its own decoding (found by a review,
    2026-12-06: 4 of 12 tiny cases differed). Plain decoding in int8 stays allowed."""
    from specrag.decoding.incremental import PromptFeed
    from specrag.errors import InputError
    from specrag.models.options import DecodeOptions
    from specrag.models.registry import chat_model_from_spec
    from specrag.nodes.streaming import stream_model
    from tests.tiny import save_tiny

    tokenizer = load_lm().tokenizer
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny(tmp_path / "short", tokenizer)
    model = chat_model_from_spec(
        f"hf:{tmp_path / 'short'}", max_new_tokens=4, speculation="none", dtype="int8"
    )
    assert model.invoke(rag("Who led them?")).response_metadata["decoding"]["new_tokens"]
    feed = PromptFeed()
    feed.close()
    with pytest.raises(InputError, match="an incremental answer: .*int8 is for a drafter only"):
        await stream_model(
            model,
            rag("Who led them?"),
            budget_s=60.0,
            tags=["answer"],
            options=DecodeOptions(prompt_feed=feed),
        )


MISTRAL_V01 = (  # Mistral-Instruct v0.1/v0.2's template: user and assistant turns only
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)


def test_a_template_without_a_system_turn_gets_the_system_text_in_the_first_user_turn():
    """A local model whose chat template refuses a system role (Mistral-Instruct v0.1/v0.2,
    Gemma) could never answer: every route failed with TemplateError and the run ended in
    the fallback (a review, 2026-12-06). The system text now opens the first user turn, in
    the answer's prompt and in RAPID's document layout alike."""
    import copy
    from types import SimpleNamespace

    from specrag.models.rapid_chat import layout

    tok = copy.deepcopy(load_lm().tokenizer)
    tok.chat_template = MISTRAL_V01
    loaded = SimpleNamespace(tokenizer=tok)
    messages = [SystemMessage("Answer briefly."), HumanMessage("Who led them?")]
    text = tok.decode(encode_chat(loaded, messages))
    assert text.endswith("[INST] Answer briefly.\n\nWho led them? [/INST]"), text
    history = [*messages, AIMessage("Rollo."), HumanMessage("When?")]
    assert tok.decode(encode_chat(loaded, history)).endswith(
        "Who led them? [/INST]Rollo.<|im_end|>[INST] When? [/INST]"
    )
    head, context, tail = layout(loaded, "Use the document.", "Rollo led them.", "Who?")
    rendered = tok.decode(head + context + tail)
    assert rendered.startswith("<|im_start|>[INST] Use the document.\n\n<document>\nRollo led")
    tok.chat_template = "{{ raise_exception('broken template') }}"  # no system turn to blame
    with pytest.raises(Exception, match="broken template"):
        encode_chat(loaded, [HumanMessage("Who?")])


def test_an_incremental_answer_s_usage_counts_the_prompt_it_stands_on(tmp_path, monkeypatch):
    """A review (2026-12-07): usage_metadata.input_tokens counted the first batch's prompt of
    an answer rebuilt on a longer one (43 where serial RAG on the same prompt said 62)."""
    from langchain_core.messages import HumanMessage, SystemMessage

    from specrag.decoding.incremental import PromptFeed
    from specrag.models.options import DecodeOptions

    model = short_model(tmp_path, monkeypatch, max_new_tokens=12)
    asked = "Question: who led the Norse?"
    first = [SystemMessage("Answer."), HumanMessage(f"<evidence n=1>Rollo</evidence>\n{asked}")]
    later = [
        SystemMessage("Answer."),
        HumanMessage(
            "<evidence n=1>Rollo led the Norse settlers of Normandy.</evidence>\n"
            f"<evidence n=2>The treaty of 911 gave them the land.</evidence>\n{asked}"
        ),
    ]

    class Later(PromptFeed):  # the second batch's prompt, put once the answer has begun
        asked = 0

        @property
        def pending(self) -> bool:
            self.asked += 1
            if self.asked == 3:
                self.put(later)
                self.close()
            return self._pending

    chunks = list(model.stream(first, options=DecodeOptions(prompt_feed=Later())))
    usage = next(c.usage_metadata for c in chunks if c.usage_metadata)
    decoding = chunks[-1].response_metadata["decoding"]
    assert decoding["rebuilds"], decoding  # the answer was rebuilt on the later prompt
    serial = list(model.stream(later))
    serial_usage = next(c.usage_metadata for c in serial if c.usage_metadata)
    assert usage["input_tokens"] == decoding["prompt_tokens"] == serial_usage["input_tokens"]


class AddsBos:
    """A base model's tokenizer: no chat template, a BOS before every text it is given."""

    chat_template = None

    def __init__(self, tok, eos=False):
        self.tok, self.bos_token_id, self.eos = tok, tok.bos_token_id, eos

    def __call__(self, text, add_special_tokens=True):
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        if add_special_tokens:  # some also end every text (``add_eos_token=True``)
            ids = [self.bos_token_id, *ids, *([self.tok.eos_token_id] if self.eos else [])]
        return {"input_ids": ids}

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_model_without_a_chat_template_reads_one_transcript_on_both_routes():
    """A review (2026-12-07), on base models: RAPID's prompt left out the BOS the tokenizer
    adds (ChatLocalLM's had it) and read "instructions ... Answer:" where ChatLocalLM's read
    "system: ... assistant:"; and a model going on with that transcript wrote "\\n\\nuser:",
    which no stop sequence caught (they name "User:"). One transcript, capitalised, on both."""
    from types import SimpleNamespace

    from specrag.models.local import first_stop
    from specrag.models.rapid_chat import layout
    from specrag.prompts import INVENTED_TURNS

    base = load_lm().tokenizer
    tok = AddsBos(base)
    loaded = SimpleNamespace(tokenizer=tok)
    prompt = encode_chat(loaded, [SystemMessage("Answer briefly."), HumanMessage("Who led?")])
    assert prompt[0] == tok.bos_token_id
    assert base.decode(prompt[1:]) == "System: Answer briefly.\n\nUser: Who led?\n\nAssistant:"
    # a tokenizer that also ends every text: no end token after the generation prompt
    ends = SimpleNamespace(tokenizer=AddsBos(base, eos=True))
    assert encode_chat(ends, [SystemMessage("Answer briefly."), HumanMessage("Who led?")]) == prompt
    head, context, tail = layout(loaded, "Use the document.", "Rollo led them.", "Who led?")
    assert head[0] == tok.bos_token_id and head.count(tok.bos_token_id) == 1
    assert base.decode(head[1:] + context + tail) == (
        "System: Use the document.\n\nUser: <document>\nRollo led them.\n</document>\n\n"
        "Question: Who led?\n\nAssistant:"
    )
    invented = "Rollo.\n\nUser: And then?"  # the turn a model writes next in that transcript
    assert invented[: first_stop(invented, INVENTED_TURNS)] == "Rollo.\n"
