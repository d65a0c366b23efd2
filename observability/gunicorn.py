"""gunicorn settings for CaseHub (`gunicorn -c python:observability.gunicorn`).

In prometheus-client's multiprocess mode each worker process writes its metrics to files under
`PROMETHEUS_MULTIPROC_DIR`; when a worker exits, its live gauges are dropped (its counters stay,
summed into every later scrape).
"""

from __future__ import annotations

import os
from typing import Any

# The longest request line gunicorn accepts (its maximum; 4,094 by default). The API refuses a
# query string over casehub.api.QUERY_MAX_LENGTH itself, with a 414 in JSON that it documents;
# gunicorn's own 414 (plain text) is left for lines longer than this.
limit_request_line = 8190


def child_exit(server: Any, worker: Any) -> None:
    """Mark an exited worker's metrics files dead (multiprocess mode only)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
