"""The key holder dies mid-run: a real `forge optimize` with a key in its environment (so the job runs in a
keyless child that sends its requests through the key holder), the key holder killed with SIGKILL while a
request is in flight. The child must notice, stop searching, store the run as failed and say why in one line."""

import os
import signal
import subprocess
import sys
import time

from conftest import MODELS, ROOT
from llm_server import FakeLLM, Step

from forge.store import Store

SECRET = "sk-forge-holder-test"


def test_a_killed_key_holder_fails_the_run_in_one_stored_line(tmp_path):
    db = tmp_path / "forge.db"
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "CXX", "CC")}
    with FakeLLM(lambda p: [Step(fault="hang")], key=SECRET) as server:  # a request stays in flight
        env = {**base, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": SECRET, "OPENAI_BASE_URL": server.url + "/v1",
               "FORGE_CACHE": str(tmp_path / "cache")}
        holder = subprocess.Popen([sys.executable, "-m", "forge.cli", "optimize", str(MODELS / "sincos_erf.py"),
                                   "--policy", "openai:gpt-4o-mini", "--seconds", "300", "--no-inductor",
                                   "--db", str(db), "--out", str(tmp_path / "runs")],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 180
            while not server.completions() and time.monotonic() < deadline and holder.poll() is None:
                time.sleep(0.2)
            assert server.completions(), "no request reached the server"
            os.kill(holder.pid, signal.SIGKILL)  # the key holder; the child (the search) runs on, orphaned
            killed = time.monotonic()
            # the child holds the pipes too: they close when it exits (before the fix it ran to --seconds 300)
            _, err = holder.communicate(timeout=120)
            took = time.monotonic() - killed
        finally:
            holder.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("forge: error: the LLM key holder"), err[-3000:]
    assert "Traceback" not in err and took < 100, (took, err[-3000:])
    store = Store(db)
    (run,) = store.list_runs()
    assert run.state == "failed" and "key holder" in run.note and "is gone" in run.note, (run.state, run.note)
    stops = {t.stop_reason for t in store.get_tasks(run.id) if t.stop_reason}
    assert stops and any("key holder" in s for s in stops), stops  # the searched tasks say why they stopped
