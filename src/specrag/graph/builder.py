"""Assembling the graph.

```
START ─► prepare ─┬─► retrieve ─┐
                  └─► draft ────┴─► gate ─┬─► refine ──────────► END   (error ─► generate)
                                          ├─► rapid_generate ──► END   (error ─► generate;
                                          │                             no evidence: fallback)
                                          ├─► generate ────────► END   (error ─► fallback)
                                          └─► fallback ────────► END
```
``prepare`` loads models (``load_s``, outside every budget), starts a clean run state (a
thread's next question inherits nothing) and indexes a long document outside the retrieval
budget. ``retrieve`` and ``draft`` then run in parallel and join at ``gate``.
"""

from __future__ import annotations

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from specrag.graph.context import SpecRagContext
from specrag.graph.routing import route_after_gate, route_after_generate, route_after_refine
from specrag.graph.services import Services
from specrag.graph.state import InputState, OutputState, State
from specrag.nodes.draft import make_draft
from specrag.nodes.fallback import fallback
from specrag.nodes.gate import gate
from specrag.nodes.generate import make_generate
from specrag.nodes.prepare import make_prepare
from specrag.nodes.rapid import make_rapid_generate
from specrag.nodes.refine import make_refine
from specrag.nodes.retrieve import make_retrieve


def build_graph(
    services: Services | None = None, *, checkpointer: object | None = None
) -> CompiledStateGraph[State, SpecRagContext, InputState, OutputState]:
    """Compile the specrag graph (``services`` swaps models/retriever; tests use fakes)."""
    services = services or Services()
    builder = StateGraph(
        State, context_schema=SpecRagContext, input_schema=InputState, output_schema=OutputState
    )
    builder.add_node("prepare", make_prepare(services))
    builder.add_node("retrieve", make_retrieve(services))
    builder.add_node("draft", make_draft(services))
    builder.add_node("gate", gate)
    builder.add_node("refine", make_refine(services))
    builder.add_node("rapid_generate", make_rapid_generate(services))
    builder.add_node("generate", make_generate(services))
    builder.add_node("fallback", fallback)

    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "retrieve")
    builder.add_edge("prepare", "draft")
    builder.add_edge(["retrieve", "draft"], "gate")  # the join: waits for both
    builder.add_conditional_edges(
        "gate",
        route_after_gate,
        ["refine", "generate", "rapid_generate", "fallback"],
    )
    builder.add_conditional_edges("refine", route_after_refine, ["generate", END])
    builder.add_conditional_edges(
        "rapid_generate", route_after_refine, ["generate", "fallback", END]
    )
    builder.add_conditional_edges("generate", route_after_generate, ["fallback", END])
    builder.add_edge("fallback", END)
    return builder.compile(name="specrag", checkpointer=checkpointer)  # type: ignore[arg-type,return-value]


graph = build_graph()
