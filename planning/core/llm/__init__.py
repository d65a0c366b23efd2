"""LLM-backed planning: the model client, prompts, answer schemas, cache and recursive strategy."""
