"""The LangGraph workflow: state, context (run-time settings), routing and the builder."""
