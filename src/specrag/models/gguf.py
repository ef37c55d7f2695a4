"""GGUF files -> plain safetensors checkpoints (de-quantized once, then loaded like any model).

Import-light on purpose (torch and transformers only), so the GPU identity check
(:mod:`specrag.evaluation.identity`) can use it on a machine without the rest of the package.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specrag.models.records import Records
from specrag.paths import process_running

log = logging.getLogger(__name__)


DIGESTS = "gguf-digests.json"  # under the copies' root: sha256 by (path, size, mtime)
LEFT_BEHIND_S = 3600.0  # scratch folders and unused stale copies older than this are removed
OTHER_VERSIONS_S = 7 * 86400.0  # copies other library versions made: removed unused this long
STAMP = "specrag-converted.json"  # in a finished copy, written last: who converted it


def stamp_tag() -> str:
    """8 hex digits of :func:`conversion_stamp`: part of a copy's folder name.

    Two environments with different library versions that share a cache dir each keep their
    own copy instead of converting the other's again in turn.
    """
    text = json.dumps(conversion_stamp(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def conversion_stamp() -> dict[str, str]:
    """The libraries that de-quantize a GGUF, by version: a copy is of the versions that made it.

    An upgrade of either (a fixed conversion bug) converts again rather than keep loading a
    copy the old code wrote.
    """
    from importlib.metadata import PackageNotFoundError, version

    stamp = {}
    for lib in ("transformers", "gguf"):
        try:
            stamp[lib] = version(lib)
        except PackageNotFoundError:
            stamp[lib] = "missing"
    return stamp


def is_converted(folder: Path) -> bool:
    """True when ``folder`` holds a whole copy made by this process's library versions.

    The stamp is written (and synced) after every other file: a copy cut short by a kill or a
    power loss, or one from before stamps (2026-12-05), has none and is converted again. The
    stamp also lists each file's size (since 2026-12-06): a copy damaged later - a file
    truncated or deleted by a cache cleaner or a copy cut short - is converted again too.
    """
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or not (folder / "config.json").is_file():
        return False
    files = stamp.pop("files", {})
    if stamp != conversion_stamp() or not isinstance(files, dict):
        return False
    try:
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, TypeError):  # a file gone, or a name that is no path
        return False


def _file_sizes(folder: Path) -> dict[str, int]:
    """Each file under ``folder`` by its relative path, with its size (the stamp's list)."""
    return {
        str(f.relative_to(folder)): f.stat().st_size
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def _sync(*paths: Path, strict: bool = False) -> None:
    """Flush each file or folder in ``paths`` to disk.

    ``strict``: an error the flush reports (ENOSPC, EIO: on NFS, under a quota, data that
    never reached the disk) is raised - the copy must not be stamped whole - but for a file
    system that cannot flush that kind of file (EINVAL, ENOTSUP). Else best effort.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # e.g. a folder on Windows, which cannot be opened
            continue
        try:
            os.fsync(fd)
        except OSError as exc:
            if strict and exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                raise
        finally:
            os.close(fd)


def file_sha256(path: Path, memo: Path) -> str:
    """The sha256 of ``path``'s content, remembered in ``memo`` by (path, size, mtime).

    Hashing a 1.1 GB GGUF takes about a second, once per file and place: a reinstalled
    virtual environment unpacks it to a new path or mtime and hashes it again. A file rewritten
    in place with its size and mtime restored would keep its old digest (as make or rsync
    would trust it). An unreadable memo counts as empty; a failed write only costs a hash.
    """
    stat = path.stat()
    where = str(path.resolve())
    memo_file = Records(memo)
    known = _remembered(memo_file.get(where), stat)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    sha = digest.hexdigest()
    remember_sha256(path, memo, sha)
    return sha


def remember_sha256(path: Path, memo: Path, sha: str) -> None:
    """Record ``sha`` as ``path``'s digest in ``memo`` (a writer that hashed what it wrote)."""
    stat = path.stat()
    record = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha}
    Records(memo).put(str(path.resolve()), record)


def _remembered(record: object, stat: os.stat_result) -> str | None:
    """The digest in a memo ``record`` if it was taken of a file of this size and mtime."""
    if (
        isinstance(record, dict)
        and record.get("size") == stat.st_size
        and record.get("mtime_ns") == stat.st_mtime_ns
        and isinstance(record.get("sha256"), str)
    ):
        return str(record["sha256"])
    return None


def converted_dir(gguf: Path, dtype: torch.dtype, root: Path) -> Path:
    """Where under ``root`` the converted copy of ``gguf`` in ``dtype`` lives.

    Keyed by the file's content (the sha256 of every byte, :func:`file_sha256`), not by its
    path or mtime: a reinstalled virtual environment, or a second checkout, unpacks the same
    wheel to a new path with a new mtime and reuses the copy instead of converting (and
    keeping) another one, and two GGUFs that differ anywhere (a fine-tune with the base's
    metadata and size) never share one. Copies of the same file name that no GGUF in this
    cache's memo has any more (a replaced wheel, the keys of before 2026-12-04: the path and
    mtime, then the size and the first and last MiB) and that were not used for an hour are
    removed by the next conversion (:func:`prune_stale_copies`): an existing copy's mtime is
    touched here, as it is about to be used. A copy is used only when its stamp names this
    process's transformers and gguf versions (:func:`is_converted`); else it is converted again
    in place.
    """
    sha = file_sha256(gguf, root / DIGESTS)
    folder = root / f"{gguf.stem}-{str(dtype).split('.')[-1]}-{sha[:12]}-c{stamp_tag()}"
    with contextlib.suppress(OSError):
        os.utime(folder)  # "used now" for the pruning (a missing copy: nothing to touch)
    return folder


def free_bytes(folder: Path) -> int:
    """Bytes this process may still write in ``folder``'s file system."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root may use the reserved blocks too
        stat = os.statvfs(folder)
        return stat.f_bfree * stat.f_frsize
    return shutil.disk_usage(folder).free


def room_for(gguf: Path, folder: Path, dtype: torch.dtype) -> str | None:
    """Why ``folder`` cannot take ``gguf``'s converted copy, or None (it can, or unknown).

    Asked before the de-quantization (a minute and more): a read-only or full cache dir was
    told only after it. The room needed is the weights' elements (read from the GGUF's
    header) at ``dtype``'s size.
    """
    try:  # a read-only mount refuses root too (os.access would not tell)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write to {folder}: {exc.strerror or exc}"
    try:
        from gguf import GGUFReader

        elements = sum(int(t.n_elements) for t in GGUFReader(str(gguf)).tensors)
        free = free_bytes(folder)
    except Exception:  # noqa: BLE001 - the conversion itself says what is wrong with the file
        return None
    need = elements * torch.empty(0, dtype=dtype).element_size()
    if free < need * 1.05:
        return (
            f"its weights need about {need / 2**30:.1f} GiB in {folder}, which has "
            f"{free / 2**30:.1f} GiB free"
        )
    return None


def convert_gguf(gguf: Path, target: Path, dtype: torch.dtype) -> None:
    """De-quantize a GGUF once and save a plain safetensors checkpoint next to its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s (first load only) ...", gguf.name)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    # transformers refuses to serialise a model that still carries its GGUF quantizer marker,
    # although the weights are already de-quantized: drop the marker, then save normally.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - the attribute is typed non-optional
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # killed conversions' scratch (``<name>[.<token>].tmp<pid>``)
    _remove_left_behind(target.parent, glob.escape(target.name) + ".*tmp*", only=SCRATCH.search)
    tmp = scratch_name(target, "tmp")
    outdated = scratch_name(target, "prune", hidden=True)
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        # the weights on disk before the stamp says they are whole
        _sync(*tmp.rglob("*"), strict=True)
        stamp = {**conversion_stamp(), "files": _file_sizes(tmp)}
        (tmp / STAMP).write_text(json.dumps(stamp), encoding="utf-8")
        _sync(tmp / STAMP, tmp, strict=True)
        if target.is_dir() and not is_converted(target):
            # half of a copy (a killed removal), or one older library versions wrote
            with contextlib.suppress(OSError):
                os.replace(target, outdated)
        try:
            os.replace(tmp, target)  # atomic: a killed conversion never leaves a half cache
        except OSError:
            # another process finished the same conversion first: its copy is as good
            if not is_converted(target):
                raise
        _sync(target.parent)  # the rename itself
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(outdated, ignore_errors=True)
    tidy_copies(gguf, target)


def tidy_copies(gguf: Path, kept: Path) -> None:
    """:func:`prune_stale_copies` after a conversion AND on a load of a converted copy.

    (Only after conversions, an old library version's copy outlived its week: every later
    load found its own copy converted, and nothing pruned until the next upgrade.) Tidying up
    never fails a load or a conversion: a warning says what could not be removed.
    """
    try:
        prune_stale_copies(gguf, kept)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not remove stale converted copies of %s: %s", gguf.name, exc)


def _remove_left_behind(
    root: Path,
    pattern: str,
    min_age_s: float = LEFT_BEHIND_S,
    only: Callable[[str], object] = lambda name: True,
) -> None:
    """Delete what matches ``pattern`` under ``root`` and is old or a gone process's.

    Old: older than ``min_age_s``; gone: its name ends with the id of a process no longer
    running here (:func:`_dead`) and nothing in it changed for :data:`GONE_WRITER_S`. The
    scratch folders and files of a conversion, a join or a removal that was killed (GBs
    each); others may belong to a run still at work. One that vanishes meanwhile is skipped,
    and so is a name ``only`` refuses.
    """
    for left in root.glob(pattern):
        if not only(left.name):
            continue
        with contextlib.suppress(OSError):
            if left.stat().st_mtime < time.time() - min_age_s or (
                _dead(left.name) and _untouched(left, GONE_WRITER_S)
            ):
                if left.is_dir():
                    shutil.rmtree(left, ignore_errors=True)
                else:
                    left.unlink()


SCRATCH = re.compile(r"\.(?:tmp|prune)(\d+)$")  # a scratch name's end: the writer's pid


def scratch_name(path: Path, kind: str, hidden: bool = False) -> Path:
    """A scratch name beside ``path`` no other writer uses: ``<name>.<token>.<kind><pid>``.

    The pid alone was not enough: writers in two containers sharing the cache dir often have
    the same one (1), and truncated each other's join. It still ends as :data:`SCRATCH` says.
    """
    return path.with_name(
        f"{'.' if hidden else ''}{path.name}.{secrets.token_hex(4)}.{kind}{os.getpid()}"
    )


# Scratch whose writer's pid is not running here, written to this long ago, is a killed run's:
# a writer on another host or container sharing the cache dir (its pid unseen here) is
# still writing to it.
GONE_WRITER_S = 600.0


def _untouched(path: Path, age_s: float) -> bool:
    """Whether nothing in ``path`` (a file, or a folder and its files) changed for ``age_s``."""
    newest = path.stat().st_mtime
    if path.is_dir():
        newest = max([newest, *(f.stat().st_mtime for f in path.rglob("*"))])
    return newest < time.time() - age_s


def _dead(name: str) -> bool:
    """Whether ``name`` ends with ``.tmp<pid>`` / ``.prune<pid>`` of a process not running."""
    found = SCRATCH.search(name)
    pid = int(found[1]) if found is not None else os.getpid()
    # a pid past a pid_t (os.kill's OverflowError) is no process's: never judged gone
    return pid != os.getpid() and pid < 2**31 and not process_running(pid)


def remove_left_behind(root: Path) -> None:
    """Sweep ``root`` (the converted copies, or the joined GGUFs) of killed runs' scratch.

    Only names that end as scratch does (``.tmp<pid>``, ``.prune<pid>``): a copy of a GGUF
    whose own name holds ``.tmp`` is no scratch.
    """
    with contextlib.suppress(OSError):
        for pattern in ("*.tmp[0-9]*", ".*.prune[0-9]*"):
            _remove_left_behind(root, pattern, only=SCRATCH.search)


def prune_stale_copies(gguf: Path, kept: Path, min_age_s: float = LEFT_BEHIND_S) -> list[Path]:
    """Remove other converted copies of a file named like ``gguf`` that nothing uses any more.

    A copy ``<stem>-<dtype>-<key>[-c<tag>]`` next to ``kept`` is stale when ``key`` is not
    ``kept``'s own, begins no digest remembered in the cache's memo for a GGUF that is still
    where it was, as it was (same size and mtime), and the copy was not made or used (its
    mtime, touched by :func:`converted_dir`) for ``min_age_s``: a copy in use, or one whose
    digest record two processes writing the memo at once dropped, is in use within that time.
    A copy of a live GGUF that other library versions made (another ``tag``, or none: before
    stamps) is stale once unused for :data:`OTHER_VERSIONS_S` (another environment sharing the
    cache dir may still use it).
    Copies of other file names are left alone. A copy is renamed to a hidden name before it is
    deleted, so a removal cut short never leaves a half copy under a key. Returns what was
    removed; each removal is logged with its size.
    """
    root = kept.parent
    name = re.compile(rf"{re.escape(gguf.stem)}-[a-z0-9]+-([0-9a-f]{{12}})(?:-c([0-9a-f]{{8}}))?")
    live = {found[1]} if (found := name.fullmatch(kept.name)) else set()
    for where, record in Records(root / DIGESTS).read().items():
        try:
            sha = _remembered(record, Path(where).stat())
        except (OSError, ValueError):  # gone, unreadable, or not a path at all
            continue
        if sha is not None:
            live.add(sha[:12])
    _remove_left_behind(root, f".{glob.escape(gguf.stem)}-*.prune*", min_age_s)  # cut short
    removed = []
    for copy in sorted(root.iterdir()):
        found = name.fullmatch(copy.name)
        if not found or copy == kept or not copy.is_dir():
            continue
        # of a GGUF still here, by other library versions (or before stamps): kept a week
        # unused, for another environment sharing this cache dir
        ours = found[2] == stamp_tag()
        if found[1] in live and ours:
            continue
        age = min_age_s if found[1] not in live else max(min_age_s, OTHER_VERSIONS_S)
        try:
            if copy.stat().st_mtime > time.time() - age:
                continue
            size = sum(f.stat().st_size for f in copy.rglob("*") if f.is_file())
        except OSError:
            continue
        scratch = scratch_name(copy, "prune", hidden=True)
        try:
            os.replace(copy, scratch)
        except OSError:
            continue
        shutil.rmtree(scratch, ignore_errors=True)
        log.info("removed %s (%.1f GB): a converted copy no GGUF here has", copy, size / 1e9)
        removed.append(copy)
    return removed
