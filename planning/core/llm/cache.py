"""Answers to identical decomposition requests, reused instead of calling the model again.

The key is the request hash (model, messages, response schema), so a changed prompt, agent list,
state or model never hits an old answer. Only answers that validated are stored.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

__all__ = ["DecompositionCache", "InMemoryDecompositionCache"]


class DecompositionCache(Protocol):
    """Where validated model answers are kept, by request hash."""

    def get(self, key: str) -> str | None:
        """Return the stored answer text for ``key``, or None on a miss."""
        ...

    def put(self, key: str, response_text: str) -> None:
        """Store the validated answer text for ``key``."""
        ...


class InMemoryDecompositionCache:
    """A thread-safe, bounded, least-recently-used cache in process memory."""

    def __init__(self, max_entries: int = 1024) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> str | None:
        """Return the stored answer text for ``key``, or None on a miss."""
        with self._lock:
            text = self._entries.get(key)
            if text is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return text

    def put(self, key: str, response_text: str) -> None:
        """Store the answer text for ``key``, evicting the least recently used beyond the bound."""
        with self._lock:
            self._entries[key] = response_text
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
