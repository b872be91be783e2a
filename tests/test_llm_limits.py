"""Limits that hold and keys out of reach: real SDK clients against the local server (both wire formats), real
builds and workers, real `forge optimize` processes.

- time: a request never outlasts the deadline; a hanging server ends a `--seconds 60` run within 90 s;
- money: --max-usd reserves each request's worst case before it is sent, in-flight requests included;
- answers: no usage is estimated and marked; an answer past max_tokens or the size cap is cut and flagged,
  and a repair turn quotes only a part of it; provider failures are `provider_error`, not `bad_format`;
- --replay RUN reproduces a run with no server and no key;
- a kernel that looks for keys in its environment and in every /proc/<pid>/environ finds none in any
  process forge starts (and, as a control, finds a key that is there).
"""

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import MODELS, ROOT
from llm_server import FakeLLM, Step

from forge.bench import BenchConfig
from forge.capture.model_input import load_file
from forge.capture.profile import profile_model
from forge.evaluate.evaluator import Evaluator
from forge.kernel import Candidate, NoKernel, Status, TaskSpec
from forge.policy.llm import LLMConfig, LLMPolicy
from forge.policy.llm.cache import CallLog
from forge.policy.llm.limits import BudgetSpent, LLMError, answer_cap
from forge.policy.llm.prices import Price
from forge.policy.llm.prompts import Prompt
from forge.policy.llm.providers import AnthropicChat, OpenAIChat, ProviderSpec, RetryConfig
from forge.store import Store

SNOOP = (Path(__file__).parent / "llm" / "snoop.cpp").read_text()
GOOD = (Path(__file__).parent / "llm" / "good.cpp").read_text()
FAST = BenchConfig(warmup_s=0.005, budget_s=0.03, min_runs=3, max_runs=20)
RETRY = RetryConfig(attempts=3, base_s=0.01, timeout_s=30.0)
WIRES = [(OpenAIChat, "openai-compatible", "/v1"), (AnthropicChat, "anthropic", "")]
IDS = ["openai", "anthropic"]
SYSTEM = Prompt("system", "system")


def chat_of(cls, provider, path, server, price=None, max_usd=None):
    spec = ProviderSpec(provider, "fake-coder", server.url + path)
    return cls(spec, "k", RETRY, price, max_usd)


@pytest.fixture(scope="module")
def spec():
    prof, _ = profile_model(load_file(MODELS / "pointwise_chain.py"), budget_s=0.05)  # the snoop kernel's task
    return TaskSpec.of(prof.tasks[0])


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_a_request_ends_at_the_deadline(cls, provider, path):
    with FakeLLM(lambda p: [Step(fault="hang")]) as server:
        chat = chat_of(cls, provider, path, server)
        start = time.monotonic()
        with pytest.raises(LLMError, match="Timeout|deadline") as e:
            chat.complete("s", [{"role": "user", "content": "x"}], 100, deadline=start + 3.0)
        assert time.monotonic() - start < 5.0 and e.value.status is Status.PROVIDER_ERROR


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_max_usd_is_never_passed_with_requests_in_flight(cls, provider, path, tmp_path):
    # $100 per million tokens; every answer uses all of its 1000 tokens: ~$0.1 each, at most 3 fit in $0.35
    steps = lambda p: [Step("x" * 400, tokens_out=1000, sleep_s=0.5)]  # noqa: E731
    store = Store(tmp_path / "f.db")
    run = store.create_run("m")
    with FakeLLM(steps) as server:
        calls = CallLog(ProviderSpec(provider, "fake-coder"), chat_of(cls, provider, path, server),
                        Price(100.0, 100.0), max_usd=0.35, max_tokens=1000)
        calls.bind(store, run.id)
        outcomes: list[object] = []

        def ask(i: int) -> None:
            try:
                outcomes.append(calls.ask(SYSTEM, [("user", Prompt(f"request {i}", f"request {i}"))]))
            except LLMError as e:
                outcomes.append(e)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    spent = store.run_cost(run.id).usd
    assert spent <= 0.35 and calls.spent == pytest.approx(spent)
    answered = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(answered) == len(server.completions()) == 3 and server.max_in_flight <= 3
    assert all(isinstance(o, BudgetSpent) and o.status is Status.NOT_ASKED for o in outcomes if o not in answered)
    assert calls.budget_spent() and "LLM budget spent" in calls.budget_spent()


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_a_provider_reporting_more_than_max_tokens_is_charged_at_the_bound(cls, provider, path, tmp_path):
    """A server that says it wrote 5000 tokens for max_tokens=1000 (it would cost $0.50 each at $100 per
    million): charged 1000, so --max-usd 0.35 holds; the counts it reported are stored, the call marked."""
    store = Store(tmp_path / "f.db")
    run = store.create_run("m")
    with FakeLLM(lambda p: [Step("x" * 400, tokens_out=5000, sleep_s=0.3)]) as server:
        calls = CallLog(ProviderSpec(provider, "fake-coder"), chat_of(cls, provider, path, server),
                        Price(100.0, 100.0), max_usd=0.35, max_tokens=1000)
        calls.bind(store, run.id)
        threads = [threading.Thread(target=ask_quietly, args=(calls, i)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    stored = store.llm_calls(run.id)
    assert len(stored) == len(server.completions()) == 3
    assert all(c.status == "overreported" and c.tokens_out == 5000 for c in stored)
    assert all(c.usd == pytest.approx(Price(100.0, 100.0).cost(c.tokens_in, 1000)) for c in stored)
    assert store.run_cost(run.id).usd <= 0.35 and calls.spent == pytest.approx(store.run_cost(run.id).usd)


def ask_quietly(calls, i):
    """One request of a thread; its LLMError (a request with no room in the budget) is what the test expects."""
    try:
        calls.ask(SYSTEM, [("user", Prompt(f"request {i}", f"request {i}"))])
    except LLMError:
        pass


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_an_answer_without_usage_is_estimated_and_marked(cls, provider, path, tmp_path):
    store = Store(tmp_path / "f.db")
    run = store.create_run("m")
    with FakeLLM(lambda p: [Step("y" * 4000, fault="no-usage")]) as server:
        calls = CallLog(ProviderSpec(provider, "fake-coder"), chat_of(cls, provider, path, server), Price(1.0, 2.0))
        calls.bind(store, run.id)
        calls.ask(SYSTEM, [("user", Prompt("p" * 400, "p" * 400))])
    (c,) = store.llm_calls(run.id)
    assert c.status == "estimated" and c.tokens_out == 1000 and c.tokens_in >= 100
    assert c.usd == pytest.approx((c.tokens_in * 1.0 + c.tokens_out * 2.0) / 1e6)


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_a_huge_answer_is_cut_flagged_and_quoted_short(cls, provider, path, spec, tmp_path):
    huge = "Let me think. " * 150_000  # 2.1 MB of prose, no code
    store = Store(tmp_path / "f.db")
    run = store.create_run("m")
    with FakeLLM(lambda p: [Step(huge, tokens_out=582_559)]) as server:
        calls = CallLog(ProviderSpec(provider, "fake-coder"), chat_of(cls, provider, path, server), Price(0.0, 0.0),
                        max_tokens=2048)
        pol = LLMPolicy(calls, "cpu", config=LLMConfig(width=1, max_first=1, concurrency=1))
        pol.bind(store, run.id)
        (idea,) = pol.propose(spec, None)
        cand = pol.render(spec, idea)
        pol.close()
        first, repair = server.completions()
    assert isinstance(cand, NoKernel) and cand.status is Status.TRUNCATED
    stored = store.llm_calls(run.id)
    assert [c.status for c in stored] == ["truncated", "truncated"]
    assert all(len(c.response) <= answer_cap(2048) for c in stored) and stored[0].tokens_out == 582_559
    quoted = [m["content"] for m in repair.body["messages"] if m["role"] == "assistant"]
    assert len(quoted) == 1 and len(quoted[0]) < 10_000 and "characters left out" in quoted[0]
    assert len(json.dumps(repair.body)) < len(json.dumps(first.body)) + 20_000


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_a_provider_failure_is_provider_error(cls, provider, path, spec):
    with FakeLLM(lambda p: [Step(fault="500")]) as server:
        calls = CallLog(ProviderSpec(provider, "fake-coder"), chat_of(cls, provider, path, server), Price(0.0, 0.0))
        pol = LLMPolicy(calls, "cpu", config=LLMConfig(width=1, max_first=1, concurrency=1))
        (idea,) = pol.propose(spec, None)
        cand = pol.render(spec, idea)
        pol.close()
    assert isinstance(cand, NoKernel) and cand.status is Status.PROVIDER_ERROR and "HTTP 500" in cand.reason


# -- whole runs: `forge optimize` processes ----------------------------------------------------------------
def forge(args, env, timeout=300):
    """`forge ARGS` as the user would start it: its own process, with exactly `env` (the test's own
    environment never holds the keys: a kernel reading every /proc/<pid>/environ would find them there)."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "CXX", "CC")}
    return subprocess.run([sys.executable, "-m", "forge.cli", *args], env={**base, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=timeout)


def snoop_answer(prompt):
    return [Step(f"Here it is.\n\n```cpp\n{SNOOP}```\n")]


def test_the_snoop_kernel_finds_a_key_it_can_see(spec, tmp_path):
    """The control: where a process holding the secret is visible, the kernel finds it and is wrong."""
    secret = "sk-forge-leaktest-" + secrets.token_hex(8)
    decoy = subprocess.Popen(["sleep", "120"], env={"PATH": os.environ["PATH"], "SOME_API_KEY": secret})
    try:
        with Evaluator("cpu", bench=FAST) as ev:
            seen = ev.evaluate(spec, Candidate("cpu", SNOOP + "// with a decoy\n"))
    finally:
        decoy.kill()
        decoy.wait()
    with Evaluator("cpu", bench=FAST) as ev:
        clean = ev.evaluate(spec, Candidate("cpu", SNOOP + "// without\n"))
    assert not seen.status.passed and seen.status not in (Status.BUILD_ERROR, Status.FORBIDDEN_IO), seen.message
    assert clean.status.passed, clean.message


@pytest.mark.slow
def test_no_process_forge_starts_holds_a_key(tmp_path):
    """A real run: the keys in forge's environment, the server requiring one, the snoop kernel the answer: it
    passes in the workers and matches eager in the end-to-end check (in the optimize process): it saw no key."""
    secret = "sk-forge-leaktest-" + secrets.token_hex(8)
    db, out = tmp_path / "forge.db", tmp_path / "report.json"
    with FakeLLM(snoop_answer, key=secret) as server:
        env = {"OPENAI_API_KEY": secret, "ANTHROPIC_API_KEY": secret, "GITHUB_TOKEN": secret,
               "OPENAI_BASE_URL": server.url + "/v1"}
        r = forge(["optimize", str(MODELS / "pointwise_chain.py"), "--policy", "openai:gpt-4o-mini", "--budget", "4",
                   "--seconds", "120", "--no-inductor", "--db", str(db), "--out", str(tmp_path / "runs"),
                   "--json", str(out)], {**env, "FORGE_CACHE": str(tmp_path / "cache")})
        assert server.completions() and all(s.status == 200 for s in server.completions())  # the key was sent
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    (task,) = [t for t in report["tasks"] if t["candidates"]]
    assert task["best_us"] is not None, task  # passed verification in the workers: no key seen there
    ran = [m for m in report["variants"] if m["variant"]["kernels"] and not m["variant"]["rewrites"]]
    assert ran and all(m["match"] for m in ran), ran  # ran in the optimize process: no key seen there either
    assert secret not in r.stdout + r.stderr
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


@pytest.mark.slow
def test_a_hanging_server_ends_a_60_second_run_within_90(tmp_path):
    db = tmp_path / "forge.db"
    with FakeLLM(lambda p: [Step(fault="hang")]) as server:
        start = time.monotonic()
        r = forge(["optimize", str(MODELS / "sincos_erf.py"), "--policy",
                   f"openai-compatible:{server.url}/v1:fake-coder", "--seconds", "60", "--no-inductor",
                   "--db", str(db), "--out", str(tmp_path / "runs")], {"FORGE_CACHE": str(tmp_path / "cache")},
                  timeout=200)
        took = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    assert took < 90, took
    store = Store(db)
    (run,) = store.list_runs()
    failed = [c for t in store.get_tasks(run.id) for c in store.candidates(t.id) if c.parent_id is not None]
    assert failed and {c.status for c in failed} <= {"provider_error", "not_asked"}, {c.status for c in failed}


def tree(store, run_id):
    """Every candidate of a run: (task, source, status), sorted (answers arrive in any order)."""
    return sorted((t.key, c.source, c.status) for t in store.get_tasks(run_id) for c in store.candidates(t.id)
                  if c.parent_id is not None)


def bank(prompt):
    if "Make it faster" in prompt or "by the compiler" in prompt or "wrong_result" in prompt:
        return [Step(f"Fixed.\n\n```cpp\n{GOOD}```\n")]
    if "different approach" in prompt:
        return [Step(f"```cpp\n{GOOD.replace('4096', '2048')}```\n")]
    if "cache blocking" in prompt:
        return [Step(f"```cpp\n{GOOD.replace('sinf(x[i])', 'sinf(x[i] + 1)')}```\n")]  # wrong
    return [Step(f"```cpp\n{GOOD}```\n")]


@pytest.mark.slow
def test_replay_from_the_run_id_alone_offline_without_a_key(tmp_path):
    db = tmp_path / "forge.db"
    # 4 candidates: the root's first attempts, whatever the timings (deeper, the tree follows measured times)
    common = ["--budget", "4", "--seconds", "120", "--no-inductor", "--db", str(db), "--out", str(tmp_path / "runs")]
    env = {"FORGE_CACHE": str(tmp_path / "cache")}
    with FakeLLM(bank, key="local-key") as server:
        first = forge(["optimize", str(MODELS / "sincos_erf.py"), "--policy",
                       f"openai-compatible:{server.url}/v1:fake-coder", *common],
                      {**env, "OPENAI_COMPATIBLE_API_KEY": "local-key"})
    assert first.returncode == 0, first.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert run.policy == f"openai-compatible:{server.url}/v1:fake-coder"
    again = forge(["optimize", str(MODELS / "sincos_erf.py"), "--replay", run.id, *common], env)  # server stopped
    assert again.returncode == 0, again.stderr
    replayed = next(r for r in store.list_runs() if r.id != run.id)
    assert replayed.policy == run.policy
    assert tree(store, replayed.id) == tree(store, run.id) and tree(store, run.id)
    assert {c.status for c in store.llm_calls(replayed.id)} == {"replayed"}
    assert store.run_cost(replayed.id).usd == 0
