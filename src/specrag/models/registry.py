"""Turning a model spec string into a LangChain chat model.

* ``embedded`` - SmolLM2-135M-Instruct (local, :class:`ChatLocalLM`);
* ``qwen2.5-coder-0.5b`` / ``qwen2.5-coder-1.5b`` - the opt-in pair (local);
* ``hf:<hub id or path>`` - any local Hugging Face causal LM (:class:`ChatLocalLM`);
* ``provider:model`` - anything ``langchain.chat_models.init_chat_model`` knows.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel

from specrag.errors import ModelLoadError
from specrag.models.chat import ChatLocalLM
from specrag.models.loading import EMBEDDED_LM
from specrag.models.pair import PAIR


def local_model_name(spec: str) -> str | None:
    """The local model name a spec refers to, or None for a remote (provider) model."""
    if spec in ("", EMBEDDED_LM):
        return EMBEDDED_LM
    if spec in PAIR:
        return spec
    if spec.startswith("hf:"):
        return spec[3:]
    return None


# the forms a model spec takes, for error messages
SPEC_FORMS = f"'embedded', {', '.join(map(repr, PAIR))}, 'hf:<hub id or path>' or 'provider:model'"


def is_known_spec(spec: str) -> bool:
    """A spec :func:`chat_model_from_spec` can resolve: a local model's, or ``provider:model``."""
    return local_model_name(spec) is not None or ":" in spec


def _has_module(name: str) -> bool:
    """Whether module ``name`` can be imported (its parent packages are, to find it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package missing
        return False


def check_remote_spec(spec: str) -> None:
    """Raise :class:`ModelLoadError` now where ``init_chat_model`` could not build ``spec``.

    An unknown provider, or one whose integration package is not installed, is told before
    any model loads or the index opens, without building the model (no API key is read).
    Reads LangChain's provider table; a LangChain without it is left to fail at load.
    """
    import importlib.util

    try:
        from langchain.chat_models import base

        _, provider = base._parse_model(spec, None)
        package = base._BUILTIN_PROVIDERS[provider][0].split(".")[0]
    except ValueError as exc:  # an unknown provider: LangChain's first sentence says so
        first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")
        raise ModelLoadError(f"cannot create chat model {spec!r}: {first}") from None
    except (ImportError, AttributeError, KeyError, TypeError):
        return
    # LangChain falls back to langchain-community's ChatOllama, which community 0.4 removed
    community = provider == "ollama" and _has_module("langchain_community.chat_models.ollama")
    if importlib.util.find_spec(package) is None and not community:
        raise ModelLoadError(
            f"chat model {spec!r} needs the {package.replace('_', '-')} package "
            f"(pip install {package.replace('_', '-')})"
        )


def chat_model_from_spec(
    spec: str, *, device: str = "auto", dtype: str = "auto", **params: Any
) -> BaseChatModel:
    """Build the chat model named by ``spec`` (see module docstring)."""
    local = local_model_name(spec)
    if local is not None:
        return ChatLocalLM(model_name=local, device=device, dtype=dtype, **params)
    if not is_known_spec(spec):
        raise ModelLoadError(f"unknown model {spec!r}: use {SPEC_FORMS}")
    try:
        from langchain.chat_models import init_chat_model

        return init_chat_model(spec, temperature=params.get("temperature"))
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot create chat model {spec!r}: {exc}") from exc
