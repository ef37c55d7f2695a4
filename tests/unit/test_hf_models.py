"""``hf:<path>`` models through the chat model: a local sliding-window pair (a Mistral-shaped
target and a one-layer drafter sharing its tokenizer) answers exactly as the target alone."""

import pytest
import torch
from langchain_core.messages import HumanMessage, SystemMessage
from transformers import MistralConfig, MistralForCausalLM

from specrag.models.loading import load_lm
from specrag.models.options import DecodeOptions
from specrag.models.registry import chat_model_from_spec, local_model_name

FIRST = "Evidence: Rollo led the Norse settlers of Normandy."


def test_a_local_sliding_window_pair_answers_as_the_target_alone(tmp_path, monkeypatch):
    tokenizer = load_lm().tokenizer  # the embedded model's (loaded before the cache dir moves)
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))  # layout verdicts
    config = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        sliding_window=16,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    target = MistralForCausalLM(MistralConfig(num_hidden_layers=2, **config)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    drafter = MistralForCausalLM(MistralConfig(num_hidden_layers=1, **config)).eval()
    drafter.load_state_dict(
        {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    )
    paths = {}
    for name, model in (("target", target), ("drafter", drafter)):
        paths[name] = tmp_path / name
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    messages = [
        SystemMessage("Answer from the evidence."),
        HumanMessage(
            FIRST + " The treaty of 911 gave them land along the Seine, and his descendants "
            "ruled the duchy for centuries.\nQuestion: Who led the Norse settlers?"
        ),
    ]
    spec = f"hf:{paths['target']}"
    alone = chat_model_from_spec(spec, speculation="none", max_new_tokens=40)
    pair = chat_model_from_spec(
        spec,
        drafter_model=local_model_name(f"hf:{paths['drafter']}"),
        max_new_tokens=40,
        # always proposes: this test is about the window, not the cost model, and a timed
        # step ratio of two tiny models moves past 1.0 on a busy machine (CI, 2026-12-03)
        drafter_max_cost_ratio=float("inf"),
        drafter_after_tokens=0,
        drafter_join_factor=0.0,
        drafter_pay_check=False,
        wide_pass_cheap=0.0,  # one verify regime however the timed passes come out
    )
    expected = alone.invoke(messages)
    got = pair.invoke(messages)
    decoding = got.response_metadata["decoding"]
    proposed = decoding["candidates_proposed"].get("drafter", 0)
    accepted = decoding["candidates_accepted"].get("drafter", 0)
    assert proposed > accepted > 0, decoding.get("proposer", decoding)
    assert got.content == expected.content
    assert "cache_refills" not in decoding  # the windowed layers were cropped in place
    assert expected.response_metadata["decoding"]["new_tokens"] == 40  # past the window

    # a drafter that reads a shorter prompt (drafter_evidence: the top evidence block only)
    short = [messages[0], HumanMessage(FIRST + "\nQuestion: Who led the Norse settlers?")]
    focused = pair.invoke(messages, options=DecodeOptions(drafter_messages=tuple(short)))
    decoding = focused.response_metadata["decoding"]
    proposer = decoding["proposer"]
    proposed = decoding["candidates_proposed"].get("drafter", 0)
    accepted = decoding["candidates_accepted"].get("drafter", 0)
    assert proposed > accepted > 0, proposer
    assert focused.content == expected.content
    assert proposer["drafter_prompt_tokens"] < proposer["prompt_tokens"], proposer
    # its one prefill read its own prompt (+ the tokens decoded before it joined), not the target's
    assert proposer["drafter_prompt_tokens"] <= proposer["drafter_prefill_tokens"]
    assert proposer["drafter_prefill_tokens"] < proposer["prompt_tokens"], proposer

    # a drafter whose context is shorter than the prompt and answer never reads past it
    drafter.config.max_position_embeddings = 48
    drafter.save_pretrained(tmp_path / "short-drafter")
    tokenizer.save_pretrained(tmp_path / "short-drafter")
    short_pair = pair.model_copy(
        update={"drafter_model": local_model_name(f"hf:{tmp_path / 'short-drafter'}")}
    )
    capped = short_pair.invoke(messages)
    decoding = capped.response_metadata["decoding"]
    assert capped.content == expected.content
    assert not decoding["candidates_proposed"].get("drafter"), decoding["proposer"]
    assert "drafter's context of 48 tokens" in decoding["proposer"]["why"]

    # max_tokens=0 on a call decodes nothing (it read as "unset": the model's 40 tokens)
    none = alone.invoke(messages, max_tokens=0)
    assert none.content == "" and none.response_metadata["decoding"]["new_tokens"] == 0
    try:
        alone.invoke(messages, max_tokens=-1)
    except ValueError as exc:
        assert "max_new_tokens must be >= 0" in str(exc)
    else:
        raise AssertionError("a negative max_tokens was accepted")


def test_float16_on_a_cpu_is_named_as_slow(caplog):
    """`--set dtype=fp16` on a CPU loaded without a word, then timed out (a new-user review,
    2026-12-03): PyTorch has no fast float16 kernels there."""
    with caplog.at_level("WARNING", logger="specrag.models.loading"):
        load_lm("embedded", "cpu", "float16")
    assert "float16 on a CPU has no fast kernels" in caplog.text


def test_a_device_specrag_does_not_run_on_or_a_failed_placement_is_one_line(tmp_path, monkeypatch):
    """Through the Python API `load_lm(..., "xpu")` raised torch's bare AssertionError,
    "meta" loaded as if it worked, and a failure moving the weights to the device (out of
    memory on a GPU) was torch's error, not a ModelLoadError (the CLI's checks catch none)."""
    from specrag.errors import ModelLoadError
    from specrag.models.loading import resolve_device
    from tests.tiny import save_tiny

    for device in ("xpu", "meta"):
        with pytest.raises(ModelLoadError, match="unknown device"):
            resolve_device(device)
    path = save_tiny(tmp_path / "tiny", load_lm().tokenizer)
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))

    def full(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(torch.nn.Module, "to", full)
    with pytest.raises(ModelLoadError, match="could not place model .* out of memory"):
        load_lm(str(path), "cpu", "float32")


def test_a_cuda_index_past_the_machines_gpus_is_one_line(monkeypatch):
    """A mutation review, 2026-12-08: the index check off by one (``>`` for ``>=``) passed
    every test: `--set device=cuda:1` on a one-GPU machine went on to torch's own error
    instead of naming the GPUs there are."""
    from specrag.errors import ModelLoadError
    from specrag.models.loading import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for device in ("cuda:1", "cuda:7"):
        with pytest.raises(ModelLoadError, match="this machine has 1 CUDA device") as err:
            resolve_device(device)
        assert "\n" not in str(err.value)
    for device in ("cuda:0", "cuda", "auto"):  # one name per GPU
        assert resolve_device(device) == torch.device("cuda", 0)


def test_the_tokenizers_end_of_turn_token_ends_an_answer_whatever_the_generation_config(
    tmp_path, monkeypatch
):
    """A mutation review (2026-12-08): the tokenizer's EOS left out of the end ids passed
    every test. A checkpoint whose generation config names another EOS, or none (hub and
    converted checkpoints often do), answered past the end of its turn up to
    ``max_new_tokens``."""
    from tests.tiny import tiny_llama

    tokenizer = load_lm().tokenizer  # the embedded model's (loaded before the cache dir moves)
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    ends = []
    for name, eos in (("another", 7), ("none", None)):
        model = tiny_llama(len(tokenizer), layers=1, sharpen=1.0, max_position_embeddings=256)
        model.config.eos_token_id = model.generation_config.eos_token_id = eos
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        ends.append(load_lm(str(tmp_path / name), "cpu", "float32").eos_token_ids)
    assert tokenizer.eos_token_id not in (7, None)
    assert ends == [(7, tokenizer.eos_token_id), (tokenizer.eos_token_id,)]


def test_a_loaded_model_is_served_while_another_model_loads(monkeypatch):
    """A review (2026-12-07): `load_lm` took the process-wide load lock even to return a
    model loaded already, and a first load holds it throughout (a conversion: minutes): a run
    warming its own model waited behind another run's load, past its answer budget."""
    import threading

    from specrag.models import loading

    lm, embeddings = object(), object()
    monkeypatch.setitem(loading._LM_CACHE, ("loaded-lm", "cpu", str(torch.float32)), lm)
    monkeypatch.setitem(loading._EMB_CACHE, "loaded-embeddings", embeddings)
    got: list[object] = []

    def served() -> None:
        got.append(loading.load_lm("loaded-lm", "cpu", "float32"))
        got.append(loading.load_embeddings("loaded-embeddings"))

    with loading._LM_CACHE_LOCK, loading._EMB_LOCK:  # another run's first loads, under way
        reader = threading.Thread(target=served, daemon=True)
        reader.start()
        reader.join(timeout=5)
    assert got == [lm, embeddings]
