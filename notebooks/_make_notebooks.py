"""Writes the notebooks in this folder (kept as code so they stay reviewable).

``python notebooks/_make_notebooks.py --execute`` also runs each one top to bottom (offline, CPU
defaults, a temporary data dir) and saves it WITH its outputs, so a reader on the web sees the
answers, routes and plots; the run is recorded in the notebook's metadata (``specrag_run``).
CI re-executes them to check that they still run (not that the outputs match).
"""

import datetime
import os
import subprocess
import sys
import tempfile
from typing import Any

import nbformat as nbf
from pathlib import Path

# regenerate: python notebooks/_make_notebooks.py --execute (without --execute the notebooks are
# written without their outputs, which tests/integration/test_notebooks.py requires);
# SPECRAG_NOTEBOOKS_OUT writes them elsewhere (the test that the committed cells are these)
OUT = Path(os.environ.get("SPECRAG_NOTEBOOKS_OUT") or Path(__file__).resolve().parent)
SETUP = """import atexit, os, shutil, tempfile
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a data dir of the notebook's own (not your SPECRAG_DATA_DIR: the notebook's documents stay
# out of your index), removed when the kernel stops; SPECRAG_NOTEBOOK_DATA_DIR keeps one
data_dir = os.environ.get("SPECRAG_NOTEBOOK_DATA_DIR")
if not data_dir:
    data_dir = tempfile.mkdtemp(prefix="specrag-nb-")
    atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
os.environ["SPECRAG_DATA_DIR"] = data_dir
from specrag.cli import quiet_libraries
quiet_libraries()
print("index lives in", data_dir)"""


def nb(name, cells):
    book = nbf.v4.new_notebook()
    book.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for kind, src in cells:
        book.cells.append(
            nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src)
        )
    nbf.write(book, OUT / name)


nb(
    "01_quickstart.ipynb",
    [
        (
            "md",
            "# specrag quickstart\nIndex a folder, ask a question, stream the draft and the answer, look at the route and timings. Runs offline on the embedded SmolLM2-135M and all-MiniLM-L6-v2 (CPU, a few minutes).",
        ),
        ("code", SETUP),
        ("md", "## 1. A folder of documents\nThree short notes written for this notebook."),
        (
            "code",
            """from pathlib import Path
docs = Path(os.environ["SPECRAG_DATA_DIR"]) / "docs"
docs.mkdir(parents=True, exist_ok=True)
(docs / "lighthouse.md").write_text("# The Harbor Lighthouse\\nThe Harbor Lighthouse was built in 1874 by the engineer Maria Lind. Its lamp is visible for 22 nautical miles. The lighthouse was automated in 1961.")
(docs / "bakery.txt").write_text("The North Street Bakery opens at six in the morning. Its best-known bread is a rye sourdough baked in a wood-fired oven. The bakery was founded by Tomas Berg in 1998.")
(docs / "river.html").write_text("<html><body><h1>The Silver River</h1><p>The Silver River is 312 kilometres long and flows into the Northern Sea. Its largest tributary is the Ash Creek.</p></body></html>")
sorted(p.name for p in docs.iterdir())""",
        ),
        ("md", "## 2. Index it (content-hash ids: re-indexing unchanged files adds nothing)"),
        (
            "code",
            """from specrag.indexing.pipeline import load_files, index_records
from specrag.paths import default_index_dir
report = index_records(load_files([docs]), default_index_dir())
again = index_records(load_files([docs]), default_index_dir())
print(f"first run: {report.chunks_added} chunks added; second run: {again.chunks_added} added")""",
        ),
        ("md", "## 3. Ask, streaming the draft, the route and the answer"),
        (
            "code",
            """from specrag import graph, SpecRagContext
ctx = SpecRagContext(refine_temperature=0.0, draft_policy="complete")
final = {}
async for mode, payload in graph.astream({"question": "Who built the Harbor Lighthouse?"}, context=ctx,
                                         stream_mode=["messages", "custom", "values"]):
    if mode == "messages" and payload[0].content:
        print(f"[{payload[1]['langgraph_node']}]", payload[0].content)
    elif mode == "custom":
        print("  event:", payload)
    elif mode == "values":
        final = payload
print("\\nANSWER:", final["answer"])""",
        ),
        (
            "code",
            """print("route:", final["route"], "-", final["reason"])
print("draft:", final["draft"], "| confidence:", final["draft_confidence"])
print("sources:", [c["source"] for c in final["citations"]])
final["timings"]""",
        ),
        (
            "code",
            """assert final["route"] in ("refine", "generate")
assert "lighthouse" in final["citations"][0]["source"]""",
        ),
    ],
)

nb(
    "02_speculative_vs_serial.ipynb",
    [
        (
            "md",
            "# Speculative RAG vs serial RAG\nThe same questions through three systems: serial RAG (retrieve, then generate with plain decoding), serial RAG whose answer model verifies n-grams of the evidence as speculative candidates (`speculation='prompt'`, no draft), and speculative RAG in `verify` mode (a greedy draft written while retrieval runs; the draft and the evidence become candidates). The middle one shows what the evidence alone saves, so the draft's own share is the gap between it and `verify`. Greedy answers are identical; we compare latency and forward passes per output token, with an injected retrieval delay modelling a remote store. Without a delay the local index answers before the draft has `min_draft_tokens`, so those runs take `generate` (the route says why).",
        ),
        ("code", SETUP),
        (
            "code",
            """from specrag.data.datasets import squad_paragraphs
from specrag.indexing.pipeline import index_records
from specrag.paths import default_index_dir
records = [(p.id, p.text) for p in squad_paragraphs() if p.title == "Normans"]
print(index_records(records, default_index_dir()))""",
        ),
        (
            "code",
            """import time
from specrag import build_graph, SpecRagContext
graph = build_graph()
questions = ["Who was the Norse leader?", "When was the Duchy of Normandy founded?",
             "When was the Battle of Hastings?"]
systems = {
    "serial": dict(draft_policy="off", speculation="none"),
    "serial + evidence n-grams": dict(draft_policy="off", speculation="prompt"),
    # a greedy draft: a sampled one's confidence (draft_temperature=0.8) varies run to run
    "speculative (verify)": dict(refine_mode="verify", draft_temperature=0.0),
}
for name, overrides in systems.items():  # warm-up, untimed: models, index, first-call paths
    await graph.ainvoke({"question": questions[0]}, context=SpecRagContext(**overrides))
rows = []
for delay in (0.0, 1.0):
    for name, overrides in systems.items():
        for q in questions:
            ctx = SpecRagContext(refine_temperature=0.0, answer_max_tokens=48,
                                 added_retrieval_latency_s=delay, **overrides)
            t = time.perf_counter()
            r = await graph.ainvoke({"question": q}, context=ctx)
            stats = r["stats"].get(r["route"], {})
            rows.append(dict(system=name, delay=delay, question=q, route=r["route"],
                             e2e=time.perf_counter() - t, passes=stats.get("passes_per_token"),
                             answer=r["answer"]))
for row in rows:  # passes/token is "-" when a run had no decoding statistics (e.g. budget ran out)
    passes = f"{row['passes']:.2f}" if row["passes"] is not None else "-"
    print(f"{row['system']:26} delay={row['delay']} e2e={row['e2e']:.2f}s passes/token={passes} {row['route']:8} {row['answer'][:60]}")""",
        ),
        (
            "code",
            """same = all(a["answer"] == b["answer"] for a in rows if a["system"] == "serial"
           for b in rows if b["system"] != "serial" and b["question"] == a["question"] and b["delay"] == a["delay"]
           and b["route"] == "refine")
refined = sum(r["route"] == "refine" for r in rows if r["system"] != "serial")
print(f"verify runs that took refine: {refined}; their answers identical to serial RAG:",
      same if refined else "(none to compare)")""",
        ),
        (
            "code",
            """import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 3.5))
for name in systems:
    xs = [0.0, 1.0]
    ys = [sum(r["e2e"] for r in rows if r["system"] == name and r["delay"] == d) / len(questions) for d in xs]
    ax.plot(xs, ys, marker="o", label=name)
ax.set_xlabel("injected retrieval delay (s)"); ax.set_ylabel("mean end-to-end latency (s)"); ax.legend()
plt.show()""",
        ),
    ],
)

nb(
    "03_rapid_long_documents.ipynb",
    [
        (
            "md",
            "# Long documents with RAPID\nThe target reads a ~2K-token HotpotQA document (gold paragraphs hidden among distractors); the drafter reads only the retrieved chunks. On the embedded preset both are SmolLM2-135M (the same weights, different inputs: acceptance measures how far the retrieved chunks lead it to the target's tokens); on the pair, `ChatRapid(target_model='qwen2.5-coder-1.5b', drafter_model='qwen2.5-coder-0.5b')` makes the 0.5B the drafter of the 1.5B (and `load_lm('qwen2.5-coder-1.5b')` is the baseline's target). We compare target-only decoding with RAPID (`eta=0`, lossless) and RAPID with knowledge transfer, and show the document prefix cache on a repeated question.",
        ),
        ("code", SETUP),
        (
            "code",
            """import random, time
from specrag.data.datasets import hotpot_questions, sample
from specrag.evaluation.bench_rapid import build_document
from specrag.models.loading import load_lm
loaded = load_lm("embedded")
pool = hotpot_questions()
ex = sample(pool, 1, 7)[0]
document = build_document(ex, sample(pool, 100, 8), 2048, loaded, random.Random(1))
print(ex.question, "->", ex.answers, "|", len(loaded.tokenizer(document)["input_ids"]), "tokens")""",
        ),
        (
            "code",
            """from langchain_core.messages import HumanMessage
from specrag import ChatRapid
from specrag.decoding.prefix_cache import PrefixCache
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, decode
from specrag.decoding.state import LMState
from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, layout
# target-only baseline: the same target prompt, plain greedy decoding
head, doc, tail = layout(loaded, RAPID_INSTRUCTIONS, document, ex.question)
stats = DecodeStats()
ids = [t.id for step in decode(LMState(loaded.model), head + doc + tail, max_new_tokens=40, sampler=Sampler(0.0),
                                eos_ids=loaded.eos_token_ids, stats=stats) for t in step]
results = {"target only": {"new_tokens": stats.new_tokens, "decode_s": stats.decode_s, "acceptance_rate": 0.0,
                           "target_forward_passes": stats.forward_passes + 1}}
print("target only", loaded.tokenizer.decode(ids, skip_special_tokens=True)[:200])
for name, kwargs in {"RAPID eta=0": dict(eta=0.0), "RAPID eta=5": dict(eta=5.0)}.items():
    model = ChatRapid(max_new_tokens=40, prefix_cache=PrefixCache(), **kwargs)
    msg = model.invoke([HumanMessage(ex.question)], document=document)
    m = msg.response_metadata
    results[name] = m
    print(f"{name:32} {m['new_tokens']} tokens, decode {m['decode_s']:.2f}s, acceptance {m['acceptance_rate']:.2f}, target passes {m['target_forward_passes']} | {msg.content[:200]}")""",
        ),
        (
            "code",
            """import matplotlib.pyplot as plt
names = list(results)
tps = [(results[n]["new_tokens"] - 1) / results[n]["decode_s"] for n in names]
fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
ax[0].bar(range(3), tps); ax[0].set_xticks(range(3), names); ax[0].set_ylabel("decode tokens/s")
ax[1].bar(range(3), [results[n]["acceptance_rate"] for n in names]); ax[1].set_xticks(range(3), names); ax[1].set_ylabel("acceptance rate")
plt.tight_layout(); plt.show()""",
        ),
        ("md", "Asking again on the same document (the same question here; any question would do) reuses the cached document prefix:"),
        (
            "code",
            """model = ChatRapid(max_new_tokens=24, prefix_cache=PrefixCache())
for attempt in ("first", "repeat"):
    t = time.perf_counter()
    msg = model.invoke([HumanMessage(ex.question)], document=document)
    print(attempt, f"{time.perf_counter() - t:.2f}s", "prefix_cache_hit =", msg.response_metadata["prefix_cache_hit"])""",
        ),
    ],
)

nb(
    "04_agent_tool.ipynb",
    [
        (
            "md",
            '# specrag as a tool for LangChain agents\n`make_specrag_tool()` wraps the graph as a `BaseTool`. With a real tool-calling model, pass e.g. `init_chat_model("openai:gpt-4o-mini")` to `create_agent`. The 135M local model cannot call tools (its chat template has no tool support), so the first agent below is driven by a small scripted model that calls the tool and then reports what it returned; the tool itself runs the real graph on the embedded models. The second agent is fully local on the drafter/target pair.',
        ),
        ("code", SETUP),
        (
            "code",
            """from specrag.data.datasets import squad_paragraphs
from specrag.indexing.pipeline import index_records
from specrag.paths import default_index_dir
index_records([(p.id, p.text) for p in squad_paragraphs() if p.title == "Normans"][:10], default_index_dir())""",
        ),
        (
            "code",
            """import json
from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from specrag import make_specrag_tool, SpecRagContext

class ScriptedToolCaller(BaseChatModel):
    @property
    def _llm_type(self): return "scripted"
    def bind_tools(self, tools, **kw): return self
    def _generate(self, messages, stop=None, run_manager=None, **kw):
        last = messages[-1]
        if isinstance(last, ToolMessage):
            data = json.loads(last.content)
            msg = AIMessage(content=f"{data['answer']} (sources: {', '.join(data['sources'])})")
        else:
            msg = AIMessage(content="", tool_calls=[{"name": "search_documents", "args": {"question": last.content}, "id": "1"}])
        return ChatResult(generations=[ChatGeneration(message=msg)])

tool = make_specrag_tool(SpecRagContext(refine_temperature=0.0))
agent = create_agent(ScriptedToolCaller(), tools=[tool])
result = await agent.ainvoke({"messages": [("user", "Who was the Norse leader?")]})
for m in result["messages"]:
    print(type(m).__name__, ":", (m.content or m.tool_calls)[:300] if isinstance(m.content, str) else m.content)""",
        ),
        (
            "md",
            "## A fully offline agent (the drafter/target pair)\nWith the pair installed (`make models-pair`), the agent's own model is local too: `ChatLocalLM` on Qwen2.5-Coder-1.5B-Instruct calls tools through its chat template (`bind_tools`), and specrag's tool answers on the pair (0.5B drafts, 1.5B verifies). It runs only when you opt in (`SPECRAG_NOTEBOOK_PAIR=1` in Jupyter's environment: the pair takes ~9 GB of memory and minutes per answer on a CPU); otherwise this cell says how.",
        ),
        (
            "code",
            """from specrag import ChatLocalLM
from specrag.models.pair import INSTALL_HINT, installed
from specrag.tools import AGENT_PROMPT

if not installed():
    print("the drafter/target pair is not installed:", INSTALL_HINT)
elif os.environ.get("SPECRAG_NOTEBOOK_PAIR") != "1":  # ~9 GB of memory and minutes on a CPU
    print("the pair is installed; set SPECRAG_NOTEBOOK_PAIR=1 before starting Jupyter to run this cell on it")
else:
    agent_model = ChatLocalLM(model_name="qwen2.5-coder-1.5b", max_new_tokens=160)
    offline = create_agent(
        agent_model,
        tools=[make_specrag_tool(SpecRagContext(models="pair", refine_temperature=0.0), output="text")],
        system_prompt=AGENT_PROMPT,  # from specrag.tools
    )
    result = await offline.ainvoke({"messages": [("user", "Who was the Norse leader?")]})
    for m in result["messages"]:
        print(type(m).__name__, ":", m.content[:300] or m.tool_calls)""",
        ),
        (
            "md",
            "## specrag as a node of a chat graph\nThe graph also takes `{\"messages\": [...]}`: the last human message is the question, earlier turns are history (a follow-up searches with the previous question prepended, `query_rewrite=\"concat\"`; `\"model\"` asks the draft model to rewrite it into a self-contained query), and the answer comes back as an `AIMessage` with its citations. So it drops into a `MessagesState` graph unchanged:",
        ),
        (
            "code",
            """from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from specrag import specrag_graph

chat = StateGraph(MessagesState)
chat.add_node("specrag", specrag_graph)
chat.add_edge(START, "specrag")
chat.add_edge("specrag", END)
chat = chat.compile()
state = await chat.ainvoke({"messages": [HumanMessage("Who was the Norse leader?")]},
                           context=SpecRagContext(refine_temperature=0.0))
state = await chat.ainvoke({"messages": state["messages"] + [HumanMessage("What did he swear fealty to?")]},
                           context=SpecRagContext(refine_temperature=0.0))
for m in state["messages"]:
    print(type(m).__name__, ":", m.content[:200], m.additional_kwargs.get("citations", ""))""",
        ),
    ],
)

nb(
    "05_tracing_and_studio.ipynb",
    [
        (
            "md",
            "# Tracing with LangSmith, debugging in Studio\nTracing is switched on with environment variables. To run offline, this notebook points the LangSmith client at a tiny local HTTP server that records what would be sent, then rebuilds the trace tree: the graph run, one run per node, and the model calls under them, with route and timings as metadata.\n\nFor real tracing set `LANGSMITH_TRACING=true`, `LANGSMITH_API_KEY` and `LANGSMITH_PROJECT` instead.",
        ),
        ("code", SETUP),
        (
            "code",
            """import json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
posted, patched = [], []
class Collector(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, code, body):
        data = json.dumps(body).encode(); self.send_response(code)
        self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(data)))
        self.end_headers(); self.wfile.write(data)
    def do_GET(self): self.reply(200, {"version": "local"})
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/runs/multipart"): return self.reply(404, {})
        if self.path.startswith("/runs/batch"):
            d = json.loads(body); posted.extend(d.get("post", [])); patched.extend(d.get("patch", []))
        self.reply(200, {})
server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ.update(LANGSMITH_TRACING="true", LANGSMITH_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
                  LANGSMITH_API_KEY="local", LANGSMITH_DISABLE_RUN_COMPRESSION="true")""",
        ),
        (
            "code",
            """from specrag.data.datasets import squad_paragraphs
from specrag.indexing.pipeline import index_records
from specrag.paths import default_index_dir
index_records([(p.id, p.text) for p in squad_paragraphs() if p.title == "Normans"][:10], default_index_dir())
from specrag import graph, SpecRagContext
from langchain_core.tracers.langchain import wait_for_all_tracers
result = await graph.ainvoke({"question": "Who was the Norse leader?"}, context=SpecRagContext(refine_temperature=0.0))
print(result["route"], "-", result["answer"])""",
        ),
        (
            "code",
            """import time
def collected():
    runs = {r["id"]: dict(r) for r in posted}
    for p in patched:
        runs.setdefault(p["id"], {}).update({k: v for k, v in p.items() if v is not None})
    return runs
# the last runs' records can reach the client a moment after ainvoke returns: wait until the
# root run has ended and every run seen has (20 s at most)
wait_for_all_tracers()
for _ in range(40):
    runs = collected()
    if any(r.get("parent_run_id") is None and r.get("end_time") for r in runs.values()) and all(
        r.get("end_time") for r in runs.values()):
        break
    time.sleep(0.5); wait_for_all_tracers()
children = {}
for r in runs.values():
    children.setdefault(r.get("parent_run_id"), []).append(r)
def show(run, depth=0):
    meta = {k: v for k, v in (run.get("extra", {}).get("metadata", {}) or {}).items()
            if k in ("route", "reason", "confidence", "retrieve_s", "answer_s", "total_s", "status")}
    print("  " * depth + f"{run['name']} ({run.get('run_type')}) {meta if meta else ''}")
    for child in sorted(children.get(run["id"], []), key=lambda r: r.get("dotted_order", "")):
        show(child, depth + 1)
for root in children.get(None, []):
    show(root)""",
        ),
        (
            "md",
            "## Switching tracing off\nLangSmith reads `LANGSMITH_TRACING` once and keeps it: setting it to `false` in a running process changes nothing. `langsmith.configure(enabled=False)` does:",
        ),
        (
            "code",
            """import langsmith
langsmith.configure(enabled=False)
traces = {r["trace_id"] for r in posted}
await graph.ainvoke({"question": "Who was the Norse leader?"}, context=SpecRagContext(refine_temperature=0.0))
wait_for_all_tracers(); time.sleep(1)
new = [r["name"] for r in posted if r["trace_id"] not in traces]
print("runs sent with tracing off:", len(new))
assert not new, new
server.shutdown()""",
        ),
        (
            "md",
            "## Studio\nThe repository's `langgraph.json` serves the graph. After `make demo`:\n\n```bash\n.venv/bin/langgraph dev --no-browser --port 2024\n```\n\nthen open `https://smith.langchain.com/studio/?baseUrl=http://127.0.0.1:2024`. Studio shows the parallel `retrieve`/`draft` branches, the conditional routes out of `gate`, and a form for every `SpecRagContext` field. The graph drawn here is the same:",
        ),
        (
            "code",
            """print(graph.get_graph().draw_mermaid())""",
        ),
    ],
)
print("written")


def commit() -> str:
    """The checkout's commit, ``-dirty`` where files differ from it (outputs of other code)."""
    here = Path(__file__).resolve().parent
    git = lambda *a: subprocess.run(  # noqa: E731
        ["git", *a], capture_output=True, text=True, cwd=here
    ).stdout.strip()
    changed = git("status", "--porcelain", "--untracked-files=no", "--", str(here.parent / "src"))
    return git("rev-parse", "--short", "HEAD") + ("-dirty" if changed else "")


def machine(book: Any) -> str:
    """Where the outputs were made: cores, GPU, and whether ``book``'s pair cells ran."""
    import torch

    from specrag.models.pair import installed

    gpu = f"GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no GPU"
    pair_cells = any("SPECRAG_NOTEBOOK_PAIR" in cell.source for cell in book.cells)
    ran = pair_cells and os.environ.get("SPECRAG_NOTEBOOK_PAIR") == "1" and installed()
    models = "embedded SmolLM2-135M" + (" and the Qwen2.5-Coder pair" if ran else "")
    return f"{os.cpu_count()} CPU cores, {gpu}, {models}"


def execute(path: Path) -> None:
    """Run a notebook in a fresh temporary data dir and save it with its outputs."""
    from nbclient import NotebookClient

    book = nbf.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="specrag-nb-") as tmp:
        os.environ["SPECRAG_NOTEBOOK_DATA_DIR"] = tmp
        os.environ.setdefault("MPLBACKEND", "Agg")
        NotebookClient(
            book, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp}}
        ).execute()
    book.metadata["specrag_run"] = {
        "executed": datetime.date.today().isoformat(),
        "commit": commit(),
        "machine": machine(book),
    }
    nbf.write(book, path)
    print("executed", path.name)


if "--execute" in sys.argv:
    for notebook in sorted(OUT.glob("*.ipynb")):
        execute(notebook)
