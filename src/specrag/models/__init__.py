"""Local models: loading (with a converted-model cache) and LangChain chat wrappers."""
