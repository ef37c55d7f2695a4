"""Resumable benchmark records: one JSON line per finished unit of work."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specrag.models import layout
from specrag.models.loading import dtype_name, gpu_suffix
from specrag.models.records import write_text


class RunLog:
    """Append-only JSONL; a re-run skips the keys already recorded (resume after Ctrl-C).

    Each record names the ``session`` (process) that made it. :meth:`keep_whole` makes a
    resumed run redo every group of keys (one question's systems) it finds part-recorded, so
    the systems a ratio compares always ran side by side, in one session. ``fresh``: the
    records already there are not resumed (every unit runs again), but kept in the file - a
    run of another dtype's records among them (the file was deleted: hours of them lost). A
    fresh run notes in the file which keys it runs again (:meth:`keep_whole`), so that
    resuming it after an interruption takes none of those keys from the records before it.
    """

    def __init__(self, path: Path, fresh: bool = False) -> None:
        self.path = path
        self.fresh = fresh
        self.session = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict[str, Any]] = {}
        if path.exists():
            # bytes, decoded line by line: a line cut by a kill (mid-character, too) or
            # damaged otherwise is a unit to redo, never a run that cannot resume
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # cut mid-line: the next record starts anew
                with path.open("ab") as fh:
                    fh.write(b"\n")
            for raw in data.splitlines():
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    continue
                if fresh or not isinstance(rec, dict):
                    continue
                if isinstance(rec.get("fresh"), str) and isinstance(rec.get("keys"), list):
                    for key in rec["keys"]:  # a --fresh run began here: not resumed from before
                        self.records.pop(key, None)
                elif isinstance(rec.get("key"), str):
                    self.records[rec["key"]] = rec

    def done(self, key: str) -> bool:
        """True when ``key`` was recorded by this or an earlier run."""
        return key in self.records

    def keep_whole(self, groups: Iterable[Iterable[str]]) -> int:
        """Forget the records of every group not wholly recorded; returns how many.

        Their questions run again, every system of them (a later record of a key replaces an
        earlier one when the log is read), instead of pairing a system timed in this session
        with one timed in another, perhaps on a machine that has drifted since. Under
        ``fresh`` it first writes the marker that keeps a later resume off the earlier records
        of every key in ``groups`` (the run's whole work).
        """
        whole = [list(group) for group in groups]
        if self.fresh:
            marker = {"fresh": self.session, "keys": sorted(k for g in whole for k in g)}
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(marker, ensure_ascii=False) + "\n")
        dropped = 0
        for group in whole:
            keys = list(group)
            done = [k for k in keys if k in self.records]
            # whole, but of two sessions (a --fresh run cut short, then resumed: its records
            # replace the earlier run's for some systems only) counts as part-run too
            sessions = {self.records[k].get("session") for k in done}
            if done and (len(done) < len(keys) or len(sessions) > 1):
                for k in done:
                    del self.records[k]
                dropped += len(done)
        return dropped

    def add(self, key: str, record: dict[str, Any]) -> None:
        """Record a finished unit (flushed at once)."""
        rec = {"key": key, "session": self.session, **record}
        self.records[key] = rec
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


def out_path(out_dir: Path, name: str, quick: bool, variant: str = "") -> Path:
    """``out_dir / name``; ``-variant`` and, for a ``--quick`` run, ``-quick`` before the suffix.

    A quick run and a full run share one ``--out`` folder without overwriting each other's
    files (``summary.json`` / ``summary-quick.json``), as their run logs do; so do runs of
    another ``variant`` (a dtype: ``summary-bfloat16.json``).
    """
    path = Path(name)
    tags = (f"-{variant}" if variant else "") + ("-quick" if quick else "")
    return out_dir / f"{path.stem}{tags}{path.suffix}" if tags else out_dir / name


def dtype_variant(dtype: str) -> str:
    """The file-name tag of a run in ``dtype``: none for ``auto``, else its canonical name."""
    from specrag.models.options import FLOAT_DTYPES

    return "" if dtype == "auto" else FLOAT_DTYPES.get(dtype, dtype)


def write_results(
    out_dir: Path, quick: bool, texts: dict[str, str], variant: str = ""
) -> list[str]:
    """Write each ``name: text`` of ``texts`` to :func:`out_path`; returns the paths written."""
    written = []
    for name, text in texts.items():
        path = out_path(out_dir, name, quick, variant)
        write_text(path, text)  # whole or not at all
        written.append(str(path))
    return written


def say_written(log: Any, files: list[str]) -> None:
    """Tell on ``log`` (a rich console) where a bench wrote its results, paths as written.

    Markup off: a folder named ``o[old]`` was told as ``o/...``, and one holding ``[/x]``
    raised after the files were written (a review, 2026-12-07).
    """
    log.print(
        "results written to: " + ", ".join(files), markup=False, highlight=False, soft_wrap=True
    )


def setup_tag(*models: Any) -> str:
    """Where, in which dtype and weight layout each loaded model ran, for run-log keys.

    ``cpu:float32``, ``cpu:float32:dual`` for a model given its second weight layout
    (:mod:`specrag.models.layout`), ``:dual2`` where passes from 2 rows read it (not from 4:
    :func:`~specrag.models.layout.narrow_rows`). ``auto`` resolves per machine (fp32 on a CPU,
    bf16 on a GPU; a drafter int8 or bf16 by CPU features) and the layout by a timing kept per
    machine, so a results folder carried to another machine, or a load whose timing went the
    other way, must not resume its records. The tag ends in ``@`` and a digest of the machine
    (:func:`machine_tag`): the same device type on another CPU or GPU times differently.
    """

    def tag(m: Any) -> str:
        model = getattr(m, "model", None)
        dual = ""
        if layout.in_use(model):
            rows = layout.min_rows_of(model)
            dual = ":dual" if rows == layout.MIN_ROWS else f":dual{rows}"
        return f"{getattr(m.device, 'type', m.device)}:{dtype_name(m.dtype)}{dual}"

    return "+".join(tag(m) for m in models) + "@" + machine_tag(*models)


def machine_tag(*models: Any) -> str:
    """Eight hex digits naming the machine ``models`` run on.

    A digest of its CPU model, thread count and torch version
    (:func:`specrag.models.layout.machine`) and of the name of each GPU the models use.
    """
    gpus = sorted({gpu_suffix(m.device) for m in models})
    text = layout.machine() + "".join(gpus)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def proposer_rules(setup: str) -> str:
    """A run-log key's mark for the merged proposer's rules under :func:`setup_tag`'s ``setup``.

    Where wide passes are cheap (a target other than fp32 on CPU cores) a 1-token n-gram match
    proposes since 2026-12-02 17:44 (``~ng1``). Since 2026-12-04 19:23 weak proposals stop
    at a width timed at load where wide passes are cheap too (``~wc``): an fp32 CPU target
    can be cheap as well (the packed layout on an AMD EPYC), and the setup does not say so,
    so every key carries the mark. Since 2026-12-05 21:00 the draft's first tokens are
    verified in the prefill pass (``~op``). Records made before any of them are not resumed.
    """
    return ("" if setup.startswith("cpu:float32") else "~ng1") + "~wc~op"
