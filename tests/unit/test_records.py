"""The cache dir's small JSON record files: unreadable means empty, writes are atomic."""

from __future__ import annotations

import json
import os

from specrag.models.records import Records


def test_records_round_trip_and_keep_each_others_keys(tmp_path):
    records = Records(tmp_path / "deep" / "r.json")
    assert records.read() == {} and records.get("a") is None  # no file yet
    records.put("a", {"x": 1})
    records.put("b", {"y": [2, 3]})
    assert records.get("a") == {"x": 1} and records.get("b") == {"y": [2, 3]}
    records.put("a", {"x": 4})  # replaced, the other kept
    assert json.loads(records.path.read_text()) == {"a": {"x": 4}, "b": {"y": [2, 3]}}
    assert [p.name for p in records.path.parent.iterdir()] == ["r.json"]  # no temporary left


def test_an_unreadable_file_or_a_record_that_is_no_object_counts_as_missing(tmp_path):
    records = Records(tmp_path / "r.json")
    for text in ('{"a": 3}', '{"a": [1]}', "[1, 2]", "not json", "[" * 100_000):
        records.path.write_text(text)
        assert records.get("a") is None
    records.put("b", {"z": 0})  # a bad file is replaced by a good one
    assert records.read() == {"b": {"z": 0}}


def test_a_damaged_file_is_kept_aside_with_a_warning_not_written_over(tmp_path, caplog):
    """A new user's report (2026-12-05): a damaged threads.json was silently overwritten by
    the next --thread run, and every other thread's kept settings were gone."""
    records = Records(tmp_path / "threads.json")
    records.path.write_text('{"t1": {"settings": {"seed": "3"}}, "t2": ')  # cut by a crash
    with caplog.at_level("WARNING"):
        records.put("t3", {"settings": {}})
    assert records.read() == {"t3": {"settings": {}}}
    (aside,) = tmp_path.glob("threads.json.damaged-*")
    assert aside.read_text().startswith('{"t1"') and "kept as" in caplog.text


def test_a_damaged_file_another_process_set_aside_first_is_neither_lost_nor_set_aside(tmp_path):
    """Two processes read the damaged file; one sets it aside and writes a good one. The other
    then merges into that good file: it no longer moved it aside too, under the same
    second's name, over the damaged original (which was lost)."""
    path = tmp_path / "v.json"
    path.write_text('{"old": ')
    first, second = Records(path), Records(path)
    seen = [second._load()]  # the second process reads the damaged file ...
    assert seen == [({}, b'{"old": ')]
    first.put("a", {"v": 1})  # ... the first sets it aside and starts anew ...
    load = second._load
    second._load = lambda: seen.pop() if seen else load()  # type: ignore[method-assign]
    second.put("b", {"v": 2})  # ... then the second one writes
    assert second.read() == {"a": {"v": 1}, "b": {"v": 2}}
    (aside,) = tmp_path.glob("v.json.damaged-*")
    assert aside.read_text() == '{"old": '


def test_two_writers_that_both_read_the_damaged_file_never_lose_it(tmp_path):
    """Two threads (one pid) both read the damaged file, twice; the first sets it aside and
    writes a good one, then the second writes. The second moved the first's good file aside
    under the same name, over the damaged original: now each keeps a copy of what it read."""
    path = tmp_path / "v.json"
    path.write_text('{"old": ')
    first, second = Records(path), Records(path)
    seen = [second._load(), second._load()]
    first.put("a", {"v": 1})
    load = second._load
    second._load = lambda: seen.pop() if seen else load()  # type: ignore[method-assign]
    second.put("b", {"v": 2})
    asides = list(tmp_path.glob("v.json.damaged-*"))
    assert asides and all(a.read_text() == '{"old": ' for a in asides)
    assert second.read() == {"b": {"v": 2}}  # the first's record: lost, as documented


def test_a_write_that_fails_loses_only_the_record_and_leaves_no_temporary(tmp_path, monkeypatch):
    records = Records(tmp_path / "r.json")
    records.put("a", {"x": 1})

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    records.put("b", {"y": 2})  # no exception
    assert records.read() == {"a": {"x": 1}}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    blocked = Records(tmp_path / "r.json" / "under-a-file.json")  # mkdir fails
    blocked.put("c", {"z": 3})
    assert blocked.read() == {}


def test_a_file_keeps_the_most_recently_written_records_up_to_its_limit(tmp_path):
    records = Records(tmp_path / "r.json", limit=3)
    for key in "abcd":
        records.put(key, {"k": key})
    assert list(records.read()) == ["b", "c", "d"]  # "a", written first, dropped
    records.put("b", {"k": "b2"})  # rewritten: now the most recent
    records.put("e", {"k": "e"})
    assert list(records.read()) == ["d", "b", "e"]  # "c" was the least recently written
    assert records.get("b") == {"k": "b2"}


def test_a_file_that_cannot_be_read_now_is_not_written_over(tmp_path, monkeypatch, caplog):
    """No file handle left, a disk error: the file is not known to be damaged, and writing
    over it would lose every other record (every thread's --resume settings)."""
    from pathlib import Path

    records = Records(tmp_path / "threads.json")
    records.put("t1", {"settings": {"seed": "3"}})
    real = Path.read_bytes

    def busy(self, *a, **k):
        if self == records.path:
            raise OSError(24, "Too many open files")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_bytes", busy)
    with caplog.at_level("WARNING"):
        records.put("t2", {"settings": {}})
    monkeypatch.setattr(Path, "read_bytes", real)
    assert records.read() == {"t1": {"settings": {"seed": "3"}}}
    assert "could not be read now" in caplog.text and not list(tmp_path.glob("*.damaged*"))


def test_a_file_where_the_folder_should_be_has_no_records_and_no_warning(tmp_path, caplog):
    """A cache dir that is a file warned "gguf-digests.json could not be read now" before the
    one-line error that names the cache dir (two lines; a new-user review, 2026-12-06)."""
    blocker = tmp_path / "cache"
    blocker.write_text("a file")
    records = Records(blocker / "models" / "r.json")
    with caplog.at_level("WARNING"):
        assert records.read() == {}
        records.put("a", {"x": 1})  # the write fails quietly: only the record is lost
    assert caplog.text == "" and blocker.read_text() == "a file"


def test_two_threads_writing_one_file_never_share_a_temporary(tmp_path, monkeypatch):
    """The temporary was named by the process alone: two threads of one server writing
    threads.json at once wrote into the same file (a review, 2026-12-06)."""
    import threading

    from specrag.models import records as records_module

    seen: list[str] = []
    real = os.replace
    both = threading.Barrier(2, timeout=10)  # both writers alive at once (thread ids unique)

    def replace(src, dst):
        seen.append(os.path.basename(src))
        both.wait()
        real(src, dst)

    monkeypatch.setattr(records_module.os, "replace", replace)
    path = tmp_path / "threads.json"
    writers = [
        threading.Thread(target=records_module.write_json, args=(path, {"n": n})) for n in range(2)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert len(seen) == 2 and seen[0] != seen[1], seen
    assert json.loads(path.read_text()) in ({"n": 0}, {"n": 1})
