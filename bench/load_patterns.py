"""What the simulated officers read off the pages (``load_users`` with locust, ``load_threads``).

Only ``re`` is imported here: ``load_users`` must import locust (which patches the standard
library with gevent) before threading and the like are imported.
"""

from __future__ import annotations

import re

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
GATE_LINK = re.compile(r'href="/gates/(\d+)/"')
CASE_LINK = re.compile(r'href="/cases/(\d+)/"')
VERSION = re.compile(r'name="version" value="(\d+)"')
CONTENT_HASH = re.compile(r'name="content_hash" value="([0-9a-f]*)"')
