"""A drafter with int8 linear layers (specrag.models.int8) on tiny models.

Its logits follow the fp32 model's only approximately, and the tiny drafter has half the
target's layers: every speculative test sees proposals AND rejections, and the target's
verification keeps greedy output identical to the target alone.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.drafter import DrafterPolicy, DrafterProposer, MergedProposer
from specrag.decoding.rapid import RapidConfig
from specrag.decoding.sampling import Sampler
from specrag.decoding.state import LMState
from specrag.errors import ModelLoadError
from specrag.models import int8, layout
from specrag.models.loading import dtype_name, resolve_dtype
from tests.unit.test_decoding import (  # noqa: F401 - one_thread: the same autouse fixture
    counts_msg,
    greedy,
    one_thread,
    rapid_greedy,
)
from tests.unit.test_drafter import Recording, greedy_run, tiny_pair
from tests.unit.test_vocab import prompt_of


@pytest.fixture(scope="module", params=[False, True], ids=["int8", "int8+bf16-wide"])
def pair(request):
    target, drafter = tiny_pair()
    quantized = copy.deepcopy(drafter)
    int8.quantize(quantized, wide=request.param)
    return target, drafter, quantized


def test_every_linear_layer_is_quantized_and_its_logits_stay_close(pair):
    _, drafter, quantized = pair
    assert int8.is_int8(quantized) and not int8.is_int8(drafter)
    wide = any(m.wide_weight is not None for m in quantized.modules() if hasattr(m, "wide_weight"))
    assert int8.has_wide_copy(quantized) is wide and not int8.has_wide_copy(drafter)
    # what a kept pass timing is of (specrag.models.loading._timing_slot)
    assert layout.state(quantized) == ("int8 with a bf16 copy" if wide else "int8")
    assert not [m for m in quantized.modules() if type(m) is nn.Linear]
    prompt = prompt_of(1, n=20, high=64)
    full = LMState(drafter).extend(prompt)  # a wide pass (bf16 copy, where kept) ...
    steps = LMState(quantized)
    steps.extend(prompt[:2])
    one = torch.cat([steps.extend([t]) for t in prompt[2:]])  # ... and single-token steps
    for got in (LMState(quantized).extend(prompt), one):
        assert not torch.equal(got, full[-len(got) :])  # really another numeric path
        assert (got.argmax(-1) == full[-len(got) :].argmax(-1)).float().mean() > 0.8


def test_wide_passes_take_the_bf16_copy_and_steps_the_int8_weights():
    layer = nn.Linear(32, 16)
    plain = int8.Int8Linear(copy.deepcopy(layer), wide=False)
    wide = int8.Int8Linear(copy.deepcopy(layer), wide=True)
    weight, bias = layer.weight.bfloat16(), layer.bias.bfloat16()
    for rows in (1, 3, 4, 8):  # int8.MIN_ROWS = 4: from 4 rows on the bf16 copy
        x = torch.randn(1, rows, 32)
        reference = F.linear(x.reshape(-1, 32).bfloat16(), weight, bias).float().view(1, rows, 16)
        got = wide(x)
        assert got.shape == (1, rows, 16) and got.dtype == torch.float32
        if rows >= int8.MIN_ROWS:
            torch.testing.assert_close(got, reference, rtol=0, atol=0)
        else:
            torch.testing.assert_close(got, plain(x), rtol=0, atol=0)
            assert not torch.equal(got, reference)
        error = (plain(x) - layer(x)).abs().max()  # int8 weights: close, not equal
        assert 0 < error < 0.05 * layer(x).abs().max()
    x = torch.randn(32)
    torch.testing.assert_close(wide(x), wide(x[None])[0], rtol=0, atol=0)  # a 1-D input


def test_no_answer_model_in_int8():
    """An int8 model's wide passes compute differently from its steps: a drafter dtype only."""
    from specrag.errors import InputError
    from specrag.graph.context import SpecRagContext
    from specrag.models.rapid_chat import ChatRapid

    for name in ("int8", "qint8"):
        with pytest.raises(InputError, match=r"set drafter_dtype=int8"):
            SpecRagContext(dtype=name)
        with pytest.raises(InputError, match=r"set drafter_dtype=int8"):
            ChatRapid(dtype=name).load()
    assert SpecRagContext(drafter_dtype="int8").drafter_dtype == "int8"


def test_quantizing_starts_from_an_fp32_model():
    _, drafter = tiny_pair()
    with pytest.raises(ValueError, match="fp32"):
        int8.quantize(drafter.to(torch.bfloat16), wide=False)


@pytest.mark.parametrize("seed", [3, 4])
def test_greedy_decode_with_an_int8_drafter_is_plain_decoding(pair, seed):
    target, _, quantized = pair
    prompt = prompt_of(seed, high=64)
    plain, _ = greedy_run(target, prompt)
    policy = DrafterPolicy(after_tokens=0, join_factor=0.0, min_acceptance=0.0, pay_check=False)
    recording = Recording(DrafterProposer(LMState(quantized), prompt, Sampler(0.0)))
    proposer = MergedProposer(NgramProposer({}), recording, policy)
    out, stats = greedy_run(target, prompt, proposer)
    proposed, accepted = stats.proposed.get("drafter", 0), stats.accepted.get("drafter", 0)
    assert out == plain
    assert proposed > accepted > 0, counts_msg(proposed, accepted)


def test_rapid_eta0_with_an_int8_drafter_is_target_only(pair):
    target, _, quantized = pair
    doc = prompt_of(5, n=120, high=64)
    target_prompt, drafter_prompt = doc + [5, 6], doc[-15:] + [5, 6]
    cfg = RapidConfig(gamma=4, eta=0.0, drafter_vocab=8)
    out, stats = rapid_greedy(
        LMState(target), LMState(quantized), target_prompt, drafter_prompt, 30, cfg
    )
    assert out == greedy(target, target_prompt, 30)
    assert stats.drafter_vocab_rows == 0  # an int8 output layer is not trimmed
    assert stats.draft_tokens > stats.accepted_tokens > 0, stats.as_dict()


def test_int8_is_a_cpu_dtype_named_as_it_reads_back():
    cpu = torch.device("cpu")
    assert resolve_dtype("int8", cpu) is torch.qint8
    assert resolve_dtype(dtype_name(torch.qint8), cpu) is torch.qint8
    with pytest.raises(ModelLoadError, match="CPU only"):
        resolve_dtype("int8", torch.device("cuda"))


def test_a_model_loads_in_int8_from_its_fp32_weights(tmp_path, monkeypatch):
    """``load_lm(..., "int8")``: the fp32 checkpoint, quantized at load; no weight layouts."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from specrag.models.loading import load_lm

    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))  # layout verdicts
    _, drafter = tiny_pair()
    drafter.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(64)}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), eos_token="t63"
    )
    fast.save_pretrained(tmp_path)
    loaded = load_lm(str(tmp_path), "cpu", "int8")
    assert loaded.dtype is torch.qint8 and loaded.layout.startswith("int8 linear layers")
    assert int8.is_int8(loaded.model) and next(loaded.model.parameters()).dtype is torch.float32
    assert load_lm(str(tmp_path), "cpu", "qint8") is loaded  # one copy per dtype
    plain = load_lm(str(tmp_path), "cpu", "float32")
    assert plain is not loaded and not int8.is_int8(plain.model)
    prompt = prompt_of(2, n=20, high=64)
    got, full = LMState(loaded.model).extend(prompt), LMState(plain.model).extend(prompt)
    assert (got.argmax(-1) == full.argmax(-1)).float().mean() > 0.8


def test_an_int8_drafter_beside_a_bf16_target(pair):
    """``drafter_dtype`` auto beside a bf16 target on a CPU: the merged proposer and RAPID (eta
    0) with the int8 drafter proposing for a bf16 target, proposals made and rejected; the
    output equals the bf16 target's plain greedy decode on these tiny models (a bf16 k-token
    pass can flip a near-tie against a 1-token one on real models; these have none here)."""
    target, _, quantized = pair
    target = copy.deepcopy(target).to(torch.bfloat16)
    prompt = prompt_of(3, high=64)
    plain, _ = greedy_run(target, prompt)
    policy = DrafterPolicy(after_tokens=0, join_factor=0.0, min_acceptance=0.0, pay_check=False)
    proposer = MergedProposer(
        NgramProposer({}), DrafterProposer(LMState(quantized), prompt, Sampler(0.0)), policy
    )
    out, stats = greedy_run(target, prompt, proposer)
    proposed, accepted = stats.proposed.get("drafter", 0), stats.accepted.get("drafter", 0)
    assert out == plain
    assert proposed > accepted > 0, counts_msg(proposed, accepted)
    doc = prompt_of(5, n=120, high=64)
    cfg = RapidConfig(gamma=4, eta=0.0)
    out, rstats = rapid_greedy(
        LMState(target), LMState(quantized), doc + [5, 6], doc[-15:] + [5, 6], 30, cfg
    )
    assert out == greedy(target, doc + [5, 6], 30)
    assert rstats.draft_tokens > rstats.accepted_tokens > 0, rstats.as_dict()


def test_auto_dtype_on_a_gpu_without_native_bf16_is_fp32(monkeypatch):
    """A T4 or V100 emulates bf16 slowly: `auto` took bf16 on every CUDA card (a review)."""
    from specrag.models import loading

    gpu = torch.device("cuda:0")
    monkeypatch.setattr(loading, "gpu_native_bf16", lambda device: False)
    assert loading.resolve_dtype("auto", gpu) == torch.float32
    monkeypatch.setattr(loading, "gpu_native_bf16", lambda device: True)
    assert loading.resolve_dtype("auto", gpu) == torch.bfloat16
    assert loading.resolve_dtype("auto", torch.device("cpu")) == torch.float32
