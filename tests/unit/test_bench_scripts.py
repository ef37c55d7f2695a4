"""The edges of the ``benchmarks/*.py`` scripts: one error line, one JSON document, Ctrl-C."""

import importlib.util
import json
from pathlib import Path

import pytest

from specrag.errors import ModelLoadError
from specrag.evaluation.script import run_script

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks"


def script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def told(capsys, code, expected=2):
    """The one stderr line and the stdout JSON of a failed run."""
    assert code == expected
    out, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    return err.strip(), json.loads(out)


@pytest.mark.parametrize(
    ("name", "argv", "said"),
    [  # usage errors were argparse's usage block and no JSON; rapid_variants' exited 1
        ("verify_cost", ["--reps", "0", "--json"], "--reps must be >= 1"),
        ("verify_cost", ["--widths", "1,x", "--json"], "not a comma-separated list"),
        # ratios "relative to width 1" were to the fastest width timed (a review, 2026-12-07)
        ("verify_cost", ["--widths", "4,2", "--json"], "--widths must include 1"),
        ("drafter_confidence", ["--no-such-flag", "--json"], "unrecognized arguments"),
        ("rapid_variants", ["--questions", "0", "--json"], "--questions must be >= 1"),
        ("rapid_variants", ["--variants", "[1]", "--json"], "non-empty JSON object"),
        ("gpu_identity", ["run", "--dtypes", "fp64", "--json"], "unknown dtype"),
        # a misspelt device was a traceback after minutes of loading and prompt building
        ("gpu_identity", ["run", "--device", "cdua", "--json"], "unknown device 'cdua'"),
    ],
)
def test_a_usage_error_is_one_line_and_one_json_document(capsys, name, argv, said):
    line, doc = told(capsys, run_script(name, script(name).main, argv))
    assert line.startswith(f"{name}: error: ") and said in line, line
    assert said in doc["error"]


def test_without_json_nothing_goes_to_stdout(capsys):
    assert run_script("verify_cost", script("verify_cost").main, ["--reps", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("verify_cost: error: --reps must be >= 1")


def test_ctrl_c_and_package_errors_are_one_line(capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    def not_loaded(argv):
        raise ModelLoadError("cannot load model x: not found")

    assert run_script("s", interrupted, ["--json"]) == 130
    out, err = capsys.readouterr()  # on a line of its own, as the specrag command's
    assert (err, json.loads(out)) == ("\ns: interrupted\n", {"error": "interrupted"})
    line, doc = told(capsys, run_script("s", not_loaded, ["--json"]))
    assert line == "s: error: cannot load model x: not found" and doc["error"].startswith("cannot")


def test_a_bug_keeps_its_traceback(capsys):
    """... and under --json still prints one JSON document (a review, 2026-12-07: a CUDA
    out-of-memory error in `gpu_identity.py run --json` left stdout empty)."""

    def bug(argv):
        raise ZeroDivisionError

    def oom(argv):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    with pytest.raises(ZeroDivisionError):
        run_script("s", bug, [])
    assert capsys.readouterr().out == ""
    with pytest.raises(RuntimeError):
        run_script("s", oom, ["run", "--json"])
    assert json.loads(capsys.readouterr().out) == {
        "error": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    }


def test_an_out_folder_that_cannot_be_written_is_one_line(capsys, tmp_path):
    """`--out` under a file: a FileExistsError traceback after the measurement, no JSON."""
    blocker = tmp_path / "file"
    blocker.write_text("")

    def writes(argv):
        (blocker / "results").mkdir(parents=True)
        return 0

    line, doc = told(capsys, run_script("s", writes, ["--json"]))
    assert line.startswith("s: error: ") and str(blocker) in line, line
    assert str(blocker) in doc["error"]


def test_a_model_the_gpu_script_cannot_load_is_one_line(capsys, tmp_path):
    """A foreign folder (or a hub id offline) as --target: transformers' OSError traceback."""
    import torch

    from specrag.evaluation.identity import load_model

    (tmp_path / "config.json").write_text("{}")  # a folder that is no model
    with pytest.raises(ModelLoadError, match=f"cannot load model {tmp_path}"):
        load_model(str(tmp_path), torch.float32, torch.device("cpu"))


def test_verify_cost_warms_every_width_and_keeps_its_seconds_unrounded():
    """Only the first width had a warm-up pass (with `--reps 1` every other width was timed
    cold), and the seconds were rounded to 0.1 ms before the ratios (1-2% off on a GPU
    step); a review, 2026-12-07."""
    import types

    import torch

    from tests.tiny import tiny_llama

    model = tiny_llama()
    widths = []
    model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    loaded = types.SimpleNamespace(model=model, device=torch.device("cpu"))
    secs = script("verify_cost").widths_cost(loaded, 8, [1, 3], 1)
    assert widths == [8, 1, 1, 3, 3]  # the cache, then each width warmed once and timed once
    assert set(secs) == {"1", "3"} and all(0 < s < 1 and s != round(s, 4) for s in secs.values())


def refuse_import(monkeypatch, module):
    """Importing ``module`` raises KeyboardInterrupt: a Ctrl-C in the seconds it loads."""
    import builtins

    real_import = builtins.__import__

    def importing(name, *args, **kwargs):
        if name == module:
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", importing)


@pytest.mark.parametrize(
    ("name", "module", "doc"),
    [
        ("verify_cost", "specrag.evaluation.script", {"error": "interrupted"}),
        ("rapid_variants", "specrag.evaluation.script", {"error": "interrupted"}),
        ("drafter_confidence", "specrag.evaluation.script", {"error": "interrupted"}),
        ("rag", "specrag.cli", {"error": "interrupted", "exit_code": 130}),
        ("load", "specrag.cli", {"error": "interrupted", "exit_code": 130}),
        ("rapid", "specrag.cli", {"error": "interrupted", "exit_code": 130}),
    ],
)
def test_ctrl_c_while_a_script_loads_the_package_is_one_line(
    capsys, monkeypatch, name, module, doc
):
    """A review (2026-12-07): the scripts imported the package (9-11 s under load) outside
    any handler: Ctrl-C then was a KeyboardInterrupt traceback and an empty stdout."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--json"])
    refuse_import(monkeypatch, module)
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="__main__")
    assert ended.value.code == 130
    out, err = capsys.readouterr()
    assert json.loads(out) == doc
    assert err.strip().endswith(": interrupted") and "Traceback" not in err


def test_ctrl_c_while_the_gpu_script_loads_the_package_is_one_line(capsys, monkeypatch):
    module = script("gpu_identity")
    refuse_import(monkeypatch, "specrag.evaluation.script")
    assert module.cli(["run", "--json"]) == 130
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": "interrupted"} and err == "\ngpu_identity: interrupted\n"


def test_help_with_json_is_one_json_document(capsys):
    """A review (2026-12-07): `verify_cost.py --help --json` printed the plain usage text."""
    with pytest.raises(SystemExit) as ended:
        run_script("verify_cost", script("verify_cost").main, ["--help", "--json"])
    assert ended.value.code == 0
    assert "usage:" in json.loads(capsys.readouterr().out)["help"]
    with pytest.raises(SystemExit):
        run_script("verify_cost", script("verify_cost").main, ["--help"])
    assert capsys.readouterr().out.startswith("usage:")


def test_a_failure_s_line_stays_one_line_and_names_the_file_a_rename_could_not_replace(
    capsys, tmp_path
):
    """A review (2026-12-07): a path with a newline made two stderr lines (the CLI escapes
    it); a results file that could not be replaced was told by its temporary's name (gone)."""
    from specrag.evaluation.script import ScriptError
    from specrag.models.records import write_atomically

    def bad_path(argv):
        raise ScriptError("--verify-cost /nonexist\nFAKE: second line: not a results file")

    line, doc = told(capsys, run_script("s", bad_path, ["--json"]))
    assert line == "s: error: --verify-cost /nonexist\\nFAKE: second line: not a results file"
    assert doc["error"].startswith("--verify-cost /nonexist\nFAKE")  # JSON keeps it as is

    def multi_line_package_error(argv):
        raise ModelLoadError("cannot load model x:\n  not found")

    line, doc = told(capsys, run_script("s", multi_line_package_error, ["--json"]))
    assert line == "s: error: cannot load model x: not found" == f"s: error: {doc['error']}"

    (tmp_path / "results.json").mkdir()  # in the way of the results file

    def writes(argv):
        write_atomically(tmp_path / "results.json", lambda tmp: tmp.write_text("{}"))
        return 0

    line, doc = told(capsys, run_script("s", writes, ["--json"]))
    assert line.endswith(f": {tmp_path / 'results.json'}") and ".tmp" not in line, line
    assert doc["error"].endswith(f": {tmp_path / 'results.json'}")
