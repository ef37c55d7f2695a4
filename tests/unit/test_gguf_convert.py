"""Converting a GGUF once into the cache dir: concurrent and killed conversions."""

import os
import time
from types import SimpleNamespace

import transformers

from specrag.models.gguf import convert_gguf


class Saved:
    """Stands in for a model or tokenizer: ``save_pretrained`` writes a file into a folder."""

    def __init__(self, name):
        self.name, self.config = name, SimpleNamespace()

    def save_pretrained(self, folder):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, self.name), "w") as fh:
            fh.write(self.name)


def fake_loaders(monkeypatch):
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Saved("config.json")
    )
    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Saved("tokenizer.json")
    )


def test_a_conversion_another_process_finished_first_is_used_and_leaves_nothing(
    tmp_path, monkeypatch
):
    fake_loaders(monkeypatch)
    target = tmp_path / "model-float32-abc"
    target.mkdir()
    (target / "config.json").write_text("the other process's copy")
    killed = tmp_path / "model-float32-abc.tmp4242"  # a conversion killed two hours ago
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"x" * 10)
    old = time.time() - 7200
    os.utime(killed, (old, old))
    convert_gguf(tmp_path / "model.gguf", target, None)  # renaming onto a full folder fails
    assert (target / "config.json").read_text() == "the other process's copy"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temporary copy


def test_a_first_conversion_lands_in_place(tmp_path, monkeypatch):
    fake_loaders(monkeypatch)
    target = tmp_path / "model-float32-abc"
    convert_gguf(tmp_path / "model.gguf", target, None)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "tokenizer.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
