"""LLM-backed planning: the model client, prompts, answer schemas, cache and recursive strategy."""

from planning.core.llm.cache import DecompositionCache, InMemoryDecompositionCache
from planning.core.llm.client import (
    LlmCallRecord,
    LlmClient,
    LlmNotConfigured,
    LlmResult,
    LlmSettings,
)
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition, expected_calls

__all__ = [
    "DecompositionCache",
    "InMemoryDecompositionCache",
    "LlmBudgets",
    "LlmCallRecord",
    "LlmClient",
    "LlmDecomposition",
    "LlmNotConfigured",
    "LlmResult",
    "LlmSettings",
    "expected_calls",
]
