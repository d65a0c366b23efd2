"""Export one case's chain in a fresh process and report its memory (tests only).

``python -m tests.audit.export_probe CASE_ID WARMUP_CASE_ID BUNDLE_PATH EXPORTER`` sets Django up
on the database the environment names, exports the short warm-up chain first (imports, the signing
key, the first queries are not counted), then exports CASE_ID's chain through
`export_case_bundle`, the function the auditor's export runs, and copies the bundle to
BUNDLE_PATH. It prints one JSON line: the events the manifest counts, the process's RSS before
the export and its peak during it (VmHWM reset to the RSS first: Linux's clear_refs), the
seconds it took and the signing key's public key for the offline check. A fresh process, so the
export's memory is not hidden in a heap the test's own process has already grown.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import time
from pathlib import Path

from bench.bench_audit import status_kib


def main(case_id: int, warmup_case_id: int, bundle_path: Path, exporter: str) -> dict[str, object]:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from audit.export import export_case_bundle
    from audit.signing import current_key

    user = get_user_model().objects.get(username=exporter)
    export_case_bundle(case_id=warmup_case_id, exporter=user).file.close()
    gc.collect()
    before = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")  # VmHWM := VmRSS
    started = time.perf_counter()
    bundle = export_case_bundle(case_id=case_id, exporter=user)
    seconds = time.perf_counter() - started
    peak = status_kib("VmHWM")
    with bundle.file, bundle_path.open("wb") as copy:
        shutil.copyfileobj(bundle.file, copy, 1 << 20)
    return {
        "events": bundle.summary.manifest["event_count"],
        "rss_before_kib": before,
        "rss_peak_kib": peak,
        "seconds": seconds,
        "public_key": current_key().public_key.hex(),
    }


if __name__ == "__main__":
    case, warmup, path, name = sys.argv[1:5]
    print(json.dumps(main(int(case), int(warmup), Path(path), name)), flush=True)
