"""The LangGraph API server (`langgraph dev`, in-memory) serving specrag's graph."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from specrag.data.datasets import squad_paragraphs
from specrag.indexing.pipeline import index_records
from tests.servers import free_port, running

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smol):
    data = tmp_path_factory.mktemp("server-data")
    records = [(p.id, p.text) for p in squad_paragraphs() if p.title == "Normans"][:12]
    index_records(records, data / "index")
    port = free_port()
    exe = shutil.which("langgraph", path=str(Path(sys.executable).parent)) or "langgraph"
    env = {
        **os.environ,
        "SPECRAG_DATA_DIR": str(data),
        "LANGSMITH_TRACING": "false",
        "HF_HUB_OFFLINE": "1",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    }
    url = f"http://127.0.0.1:{port}"
    cmd = [exe, "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--n-jobs-per-worker", "4"]  # its default, 1, runs one run at a time
    with running(cmd, f"{url}/ok", data / "server.log", cwd=ROOT, env=env):
        yield url


async def test_server_streams_draft_then_answer(server):
    from langgraph_sdk import get_client

    client = get_client(url=server)
    assistants = await client.assistants.search(graph_id="specrag")
    assert assistants, "graph 'specrag' not served"
    # a first run loads the models in the server process; the asserted run is the second
    warm = await client.threads.create()
    await client.runs.wait(warm["thread_id"], "specrag", input={"question": "Who was Rollo?"})
    thread = await client.threads.create()
    order = []
    final = {}
    async for part in client.runs.stream(
        thread["thread_id"],
        "specrag",
        input={"question": "Who was the Norse leader?"},
        context={"refine_temperature": 0.0, "draft_policy": "complete", "draft_timeout_s": 10.0},
        stream_mode=["messages-tuple", "custom", "values"],
    ):
        if part.event == "messages":
            chunk, meta = part.data
            if chunk.get("content"):
                order.append(meta.get("langgraph_node"))
        elif part.event == "custom" and part.data.get("event") == "route":
            order.append("route:" + part.data["route"])
        elif part.event == "values":
            final = part.data
    assert final.get("route") in ("refine", "generate")
    assert "Rollo" in final.get("answer", "")
    assert "draft" in order
    answer_node = final["route"]
    assert order.index("draft") < order.index(answer_node)  # draft tokens came first


async def test_server_concurrent_runs_keep_their_own_answers(server):
    import asyncio

    from langgraph_sdk import get_client

    client = get_client(url=server)
    questions = [
        "Who was the Norse leader?",
        "In what country is Normandy located?",
        "When were the Normans in Normandy?",
        "From which countries did the Norse originate?",
    ]
    # budgets wide: on a loaded machine a timeout's fallback answer would differ from alone's
    context = {
        "refine_temperature": 0.0,
        "answer_max_tokens": 32,
        "retrieval_timeout_s": 600.0,
        "answer_timeout_s": 600.0,
    }

    async def ask(question):
        thread = await client.threads.create()
        result = await client.runs.wait(
            thread["thread_id"], "specrag", input={"question": question}, context=context
        )
        return result["answer"], [c["source"] for c in result.get("citations") or []]

    alone = [await ask(q) for q in questions]
    together = await asyncio.gather(*(ask(q) for q in questions))
    assert list(together) == alone  # each concurrent answer belongs to its own question


async def test_server_answers_a_messages_input_with_an_ai_message(server):
    """Issue 12: the API server run with ``{"messages": [...]}`` returns an AI message whose
    citations name the sources."""
    from langgraph_sdk import get_client

    client = get_client(url=server)
    thread = await client.threads.create()
    state = await client.runs.wait(
        thread["thread_id"],
        "specrag",
        input={"messages": [{"role": "user", "content": "Who was the Norse leader?"}]},
        context={"refine_temperature": 0.0, "answer_max_tokens": 32},
    )
    human, ai = state["messages"][-2:]
    assert human["type"] == "human" and ai["type"] == "ai"
    assert ai["content"] == state["answer"] and "Rollo" in ai["content"]
    citations = ai["additional_kwargs"]["citations"]
    assert citations and all(c["source"].startswith("squad:Normans:") for c in citations)
    assert ai["response_metadata"]["route"] in ("refine", "generate")


async def test_server_tells_the_client_a_bad_settings_line(server):
    """A context value out of range reached the client as "An internal error occurred" (the
    server passes on only builtin errors' messages; InputError was not a ValueError): the
    one line, naming the setting, was in the server's log only (a review, 2026-12-06)."""
    from langgraph_sdk import get_client

    client = get_client(url=server)
    thread = await client.threads.create()
    result = await client.runs.wait(
        thread["thread_id"],
        "specrag",
        input={"question": "Who was Rollo?"},
        context={"top_k": 0},
        raise_error=False,
    )
    assert "top_k=0" in str(result), result
