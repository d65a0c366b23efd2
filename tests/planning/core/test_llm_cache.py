"""The in-memory decomposition cache."""

from __future__ import annotations

import pytest

from planning.core.llm.cache import DecompositionCache, InMemoryDecompositionCache


def test_a_stored_answer_is_returned_and_a_miss_is_none() -> None:
    cache: DecompositionCache = InMemoryDecompositionCache()
    cache.put("k1", '{"steps": []}')
    assert cache.get("k1") == '{"steps": []}'
    assert cache.get("k2") is None


def test_the_least_recently_used_entry_is_evicted_beyond_the_bound() -> None:
    cache = InMemoryDecompositionCache(max_entries=2)
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # a is now the most recently used
    cache.put("c", "C")
    assert cache.get("b") is None
    assert (cache.get("a"), cache.get("c")) == ("A", "C")
    assert len(cache) == 2
    assert (cache.hits, cache.misses) == (3, 1)


def test_a_non_positive_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        InMemoryDecompositionCache(max_entries=0)
