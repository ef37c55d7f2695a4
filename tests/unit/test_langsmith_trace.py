"""LangSmith tracing against a local HTTP server standing in for the API."""

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specrag import build_graph
from tests.fakes import ctx, services


class Collector(BaseHTTPRequestHandler):
    posted: list = []
    patched: list = []

    def log_message(self, *args):
        pass

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json(200, {"version": "0.0.0-test"} if self.path.startswith("/info") else {})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/runs/multipart"):
            return self._json(404, {"detail": "not here"})  # client falls back to /runs/batch
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path.startswith("/runs/batch"):
            payload = json.loads(body)
            Collector.posted.extend(payload.get("post", []))
            Collector.patched.extend(payload.get("patch", []))
        elif self.path.rstrip("/") == "/runs":
            Collector.posted.append(json.loads(body))
        self._json(200, {})

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Collector.patched.append(json.loads(body))
        self._json(200, {})


def fresh_client(monkeypatch):
    """LangSmith keeps the process's first client, with the endpoint it saw then: a test run
    after the dead-endpoint test posted to port 9 (and that test, after this file's first,
    to the live collector), so each test starts with none (restored after it)."""
    from langsmith import run_trees

    monkeypatch.setattr(run_trees, "_CLIENT", None)


@pytest.fixture
def langsmith_server(monkeypatch):
    Collector.posted, Collector.patched = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    monkeypatch.setenv("LANGSMITH_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("LANGSMITH_API_KEY", "test-key")
    monkeypatch.setenv("LANGSMITH_PROJECT", "specrag-test")
    monkeypatch.setenv("LANGSMITH_DISABLE_RUN_COMPRESSION", "true")
    fresh_client(monkeypatch)
    from langsmith import utils

    utils.get_env_var.cache_clear()
    utils.get_tracer_project.cache_clear() if hasattr(
        utils.get_tracer_project, "cache_clear"
    ) else None
    yield Collector
    from langchain_core.tracers.langchain import get_client, wait_for_all_tracers

    wait_for_all_tracers()
    get_client().flush()
    # The server is left running (a daemon thread) until the process exits: the LangSmith
    # client may still send a late batch at exit, which must not hit a closed port.
    utils.get_env_var.cache_clear()


async def test_graph_run_posts_one_trace_with_nodes_and_metadata(langsmith_server):
    from langchain_core.tracers.langchain import wait_for_all_tracers

    result = await build_graph(services()).ainvoke(
        {"question": "capital of France?"}, context=ctx()
    )
    wait_for_all_tracers()
    runs = {}
    for run in langsmith_server.posted:
        runs[run["id"]] = dict(run)
    for patch in langsmith_server.patched:
        runs.setdefault(patch["id"], {}).update({k: v for k, v in patch.items() if v is not None})
    roots = [r for r in runs.values() if not r.get("parent_run_id")]
    assert len(roots) == 1, [r.get("name") for r in roots]
    root = roots[0]
    assert root["name"] == "specrag"
    children = {r["name"]: r for r in runs.values() if r.get("parent_run_id") == root["id"]}
    assert {"retrieve", "draft", "gate", "refine"} <= set(children)
    assert all(r["trace_id"] == root["trace_id"] for r in runs.values())
    # a model call under the refine node
    refine_id = children["refine"]["id"]
    llm_runs = [r for r in runs.values() if r.get("run_type") == "llm"]
    assert any(r["parent_run_id"] == refine_id for r in llm_runs)
    # route and timings travel as run metadata
    gate_meta = children["gate"].get("extra", {}).get("metadata", {})
    assert gate_meta.get("route") == "refine" and "reason" in gate_meta
    refine_meta = children["refine"].get("extra", {}).get("metadata", {})
    assert refine_meta.get("answer_s") is not None and refine_meta.get("total_s") is not None
    # the answering node names the final route and why (after a re-route, only it can)
    assert refine_meta.get("route") == "refine" and refine_meta.get("reason") == result["reason"]
    assert result["route"] == "refine"


async def test_tracing_to_a_dead_endpoint_never_fails_a_run(monkeypatch):
    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    monkeypatch.setenv("LANGSMITH_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("LANGSMITH_API_KEY", "bad-key")
    fresh_client(monkeypatch)
    from langsmith import utils

    utils.get_env_var.cache_clear()
    try:
        result = await build_graph(services()).ainvoke({"question": "q?"}, context=ctx())
        assert result["answer"] == "Paris."
    finally:
        utils.get_env_var.cache_clear()


async def test_later_batches_are_traced_on_the_answer_node_as_a_list(langsmith_server):
    """An incremental run's later batches arrive while the answer node runs: their trace went to
    the retrieve run, already posted (lost), and each batch overwrote the last one's keys."""
    import dataclasses
    import time

    from langchain_core.tracers.langchain import wait_for_all_tracers

    from tests.fakes import FakeLogprobChat, two_batches

    slow = FakeLogprobChat(reply="Paris is the capital of France, it is.", delay_s=0.05, calls=[])
    svc = dataclasses.replace(
        services(answer=slow), batch_retriever=two_batches(lambda: time.sleep(0.1))
    )
    result = await build_graph(svc).ainvoke(
        {"question": "capital of France?"}, context=ctx(answer_policy="incremental")
    )
    wait_for_all_tracers()
    runs: dict = {}
    for run in langsmith_server.posted:
        runs[run["id"]] = dict(run)
    for patch in langsmith_server.patched:
        runs.setdefault(patch["id"], {}).update({k: v for k, v in patch.items() if v is not None})
    meta = {r["name"]: r.get("extra", {}).get("metadata", {}) for r in runs.values()}
    assert [b["source"] for b in result["batches"]] == ["dense", "hybrid"]
    node = result["route"]
    assert [b["source"] for b in meta[node]["batch_events"]] == ["hybrid"]  # the later one
    assert meta["retrieve"]["batches"] == 1 and "arrival_s" not in meta["retrieve"]


def test_the_cli_says_it_sends_a_pending_trace_before_the_exit_waits(monkeypatch, capsys):
    """With the endpoint down the process sat ~10 s after the answer, silent, while
    langsmith's exit handler retried (a new user, 2026-12-06): the CLI now says why first."""
    import queue

    from langsmith import run_trees

    from specrag import cli

    assert hasattr(run_trees, "_CLIENT")  # where langsmith keeps the client tracing made
    flushed = []

    class Client:
        api_url = "http://127.0.0.1:9"
        tracing_queue = queue.Queue()

        def flush(self):
            flushed.append(True)
            raise ConnectionError("down")  # tracing never fails a run

    monkeypatch.setattr(run_trees, "_CLIENT", Client())
    cli.send_traces()
    assert flushed == [] and capsys.readouterr().err == ""  # nothing pending: no line
    Client.tracing_queue.put("a run")
    cli.send_traces()
    assert flushed == [True]
    assert "sending the trace to http://127.0.0.1:9 ..." in capsys.readouterr().err


def test_ctrl_c_while_a_failed_runs_trace_is_sent_is_one_line_after_its_error(monkeypatch, capsys):
    """A failed run's error handler sent the pending trace (up to ~10 s with the endpoint
    down) before its JSON error, and Ctrl-C there escaped as a traceback (a CLI review)."""
    import json
    import queue

    from langsmith import run_trees

    from specrag import cli
    from specrag.errors import InputError

    order = []

    class Client:
        api_url = "http://127.0.0.1:9"
        tracing_queue = queue.Queue()

        def flush(self):
            order.append(("flush", capsys.readouterr().out))
            raise KeyboardInterrupt

    Client.tracing_queue.put("a run")
    monkeypatch.setattr(run_trees, "_CLIENT", Client())

    def fails(args):
        raise InputError("no such thing")

    monkeypatch.setattr(cli, "cmd_config", fails)  # bound when main builds its parser
    assert cli.main(["config", "--json"]) == 2
    ((_, out_before_flush),) = order
    assert json.loads(out_before_flush) == {"error": "no such thing", "exit_code": 2}
    assert "the trace was not sent" in capsys.readouterr().err
    # a run that finished: Ctrl-C during the send is "interrupted", as anywhere else
    with pytest.raises(KeyboardInterrupt):
        cli.send_traces()
