"""bench followup and bench load: their statistics, on fake graphs, indexes and rewrites."""

import asyncio
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from specrag.evaluation import metrics
from specrag.graph.context import SpecRagContext


def test_bench_load_runs_each_level_at_its_concurrency_and_reports_its_p90(monkeypatch):
    """A mutation review, 2026-12-08: `run_level` with every run queued behind one semaphore
    slot (concurrency 16 measured as 1), or p90 computed as the median, passed every test."""
    from specrag.evaluation import bench_load

    clock = [0.0]
    monkeypatch.setattr(bench_load, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class Graph:
        def __init__(self) -> None:
            self.running = self.most = 0

        async def ainvoke(self, state, context):
            self.running += 1
            self.most = max(self.most, self.running)
            for _ in range(3):  # the others start while this one is in flight
                await asyncio.sleep(0)
            self.running -= 1
            clock[0] += float(state["question"].removeprefix("q"))  # its latency: its number
            return {"answer": "a", "route": "generate", "citations": [{"source": "s"}]}

    questions = [f"q{i}" for i in range(1, 11)]
    for concurrency, most in ((1, 1), (4, 4), (16, 10)):
        graph = Graph()
        level = asyncio.run(bench_load.run_level(graph, questions, SpecRagContext(), concurrency))
        assert graph.most == most, concurrency
        assert level["runs"] == 10 and [o["sources"] for o in level["outputs"]] == [["s"]] * 10
    graph = Graph()
    level = asyncio.run(bench_load.run_level(graph, questions, SpecRagContext(), 1))
    latencies = [o["latency_s"] for o in level["outputs"]]
    assert latencies == [float(i) for i in range(1, 11)]  # one at a time: each its own
    assert level["p90_s"] == metrics.percentile(latencies, 90) == pytest.approx(9.1)
    assert level["p50_s"] == 5.5 and level["wall_s"] == 55.0


def test_bench_load_counts_a_changed_source_as_cross_talk(monkeypatch):
    """A mutation review, 2026-12-08: cross_talk compared answers only (a run that cited
    another question's sources with the same words counted as clean), and it passed every
    test; the same answer and sources at every level count none."""
    from specrag.evaluation import bench_load

    def outputs(level: int) -> list[dict]:
        out = [
            {"question": q, "answer": "Rollo.", "sources": ["n:1"], "route": "generate"}
            for q in ("q0", "q1", "q2")
        ]
        if level == 16:
            out[1] = {**out[1], "sources": ["n:9"]}  # another question's source, same words
        if level == 4:
            out[2] = {**out[2], "answer": "Richard."}
        return out

    async def run_level(graph, questions, ctx, concurrency):
        return {"concurrency": concurrency, "outputs": outputs(concurrency)}

    monkeypatch.setattr(bench_load, "load_lm", lambda *a: None)
    monkeypatch.setattr(bench_load, "build_graph", lambda: None)
    monkeypatch.setattr(bench_load, "run_level", run_level)
    result = bench_load.measure(["q0", "q1", "q2"], SpecRagContext(), [1, 4, 16])
    assert result["cross_talk"] == 2
    four, sixteen = result["levels"][1:]
    assert [o["question"] for o in four["mismatches"]] == ["q2"]
    assert [o["question"] for o in sixteen["mismatches"]] == ["q1"]


def test_bench_followup_reports_each_modes_gain_over_off_and_the_model_fallbacks(
    monkeypatch, tmp_path
):
    """A mutation review, 2026-12-08: the difference to `off` computed as off minus the mode
    (a rewrite that helps reported as hurting), and `fell_back` counting the model rewrites
    that did NOT fall back to concat's query, both passed every test."""
    from specrag.evaluation import bench_followup

    def case(n: int) -> dict:
        return {
            "id": f"c{n}",
            "followup": f"How long is it {n}?",
            "gold": [f"gold{n}"],
            "history": [
                {"role": "user", "content": f"Tell me about T{n}."},
                {"role": "assistant", "content": f"T{n} is covered in these documents."},
            ],
        }

    cases = [case(n) for n in range(4)]

    async def followup_query(followup, history, ctx, services):
        n = int(followup.rstrip("?").split()[-1])
        concat = bench_followup.concat_query(cases[n])
        if ctx.query_rewrite == "concat" or (ctx.query_rewrite == "model" and n == 0):
            return concat  # case 0's model rewrite fell back
        return followup if ctx.query_rewrite == "off" else f"model {n}"

    class Index:
        def search(self, query, k, mode):
            # off finds nothing, concat every gold, model only case 1's (and case 0's concat)
            if query.startswith("Tell me about T"):
                return [SimpleNamespace(source=f"gold{query[15]}")]
            return [SimpleNamespace(source="gold1" if query == "model 1" else "other")]

    monkeypatch.setattr(bench_followup, "build_cases", lambda n: cases)
    monkeypatch.setattr(bench_followup, "squad_paragraphs", lambda: [])
    monkeypatch.setattr(bench_followup, "_index", lambda name, records, log: tmp_path)
    monkeypatch.setattr(bench_followup, "open_index", lambda ctx: Index())
    monkeypatch.setattr(bench_followup, "Services", lambda: None)
    monkeypatch.setattr(bench_followup, "followup_query", followup_query)
    log = Console(file=io.StringIO())
    result = bench_followup.run(quick=True, out_dir=tmp_path, log=log)
    summary = result["summary"]
    assert summary["off"]["recall_at_3"] == 0.0 and summary["concat"]["recall_at_3"] == 1.0
    assert summary["model"]["recall_at_3"] == 0.5
    assert summary["concat"]["diff_vs_off"] == 1.0 and summary["model"]["diff_vs_off"] == 0.5
    assert summary["model_fell_back"] == 1
    written = {Path(f).name.split("-")[0].split(".")[0]: Path(f) for f in result["files"]}
    rows = json.loads(written["summary"].read_text())["cases"]
    assert [r["model"]["fell_back"] for r in rows] == [True, False, False, False]
    assert "| concat | 1.000 " in written["table"].read_text()


def test_a_squad_questions_gold_id_names_the_paragraph_that_holds_its_answer():
    """A mutation review, 2026-12-08: squad_questions numbering its gold paragraphs one past
    squad_paragraphs' ids (every bench's retrieval hit on the wrong paragraph, recall ~0)
    passed every test; so did a sample drawn unseeded (no run repeatable)."""
    from specrag.data.datasets import hotpot_questions, sample, squad_paragraphs, squad_questions

    texts = {p.id: p.text for p in squad_paragraphs()}
    questions = squad_questions()
    assert len(texts) == 1204 and questions
    for q in questions:
        (gold,) = q.gold_ids
        assert any(a in texts[gold] for a in q.answers), (q.id, gold, q.answers)
    for q in hotpot_questions()[:200]:
        assert set(q.gold_ids) <= {p.id for p in q.paragraphs}, q.id
    drawn = sample(list(range(1000)), 10, seed=7)
    assert drawn == sample(list(range(1000)), 10, seed=7) != sample(list(range(1000)), 10, 8)
    assert len(set(drawn)) == 10 and sample([1, 2], 5, seed=7) in ([1, 2], [2, 1])
