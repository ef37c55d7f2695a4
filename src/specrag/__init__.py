"""specrag: Speculative RAG and RAPID long-context decoding as LangGraph workflows."""

from specrag.errors import InputError, SpecRagError
from specrag.graph.builder import build_graph, graph
from specrag.graph.context import SpecRagContext
from specrag.models.chat import ChatLocalLM
from specrag.models.rapid_chat import ChatRapid
from specrag.runner import preload
from specrag.tools import make_specrag_tool

specrag_graph = graph  # the compiled graph under a name that reads well in a parent graph

__all__ = [
    "ChatLocalLM",
    "ChatRapid",
    "InputError",
    "SpecRagContext",
    "SpecRagError",
    "build_graph",
    "graph",
    "make_specrag_tool",
    "preload",
    "specrag_graph",
]
