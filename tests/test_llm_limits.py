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
import socket
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
from forge.errors import UserError
from forge.evaluate.evaluator import Evaluator
from forge.kernel import Candidate, NoKernel, Status, TaskSpec
from forge.policy.llm import LLMConfig, LLMPolicy, broker
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


@pytest.mark.parametrize("fault", ["hang", "drip", "drip-body"])
@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_a_request_ends_at_the_deadline(cls, provider, path, fault):
    """A server that never answers, or sends a byte a second and never finishes (no read times out): the
    request ends at the deadline all the same, counted at its worst case (it may have been billed)."""
    with FakeLLM(lambda p: [Step(fault=fault)]) as server:
        chat = chat_of(cls, provider, path, server, Price(1.0, 1.0))
        start = time.monotonic()
        with pytest.raises(LLMError, match="Timeout|deadline|cut") as e:
            chat.complete("s", [{"role": "user", "content": "x"}], 100, deadline=start + 3.0)
        took = time.monotonic() - start
        assert took < 4.5 and e.value.status is Status.PROVIDER_ERROR, took
        assert e.value.usd > 0 and chat.ledger.spent == pytest.approx(e.value.usd) and chat.ledger.reserved == 0


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_the_check_before_a_run_ends_on_a_server_that_lists_models_a_byte_a_second(cls, provider, path):
    with FakeLLM(lambda p: [Step("x")], list_fault="drip") as server:
        chat = cls(ProviderSpec(provider, "fake-coder", server.url + path), "k", RetryConfig(timeout_s=2.0))
        start = time.monotonic()
        with pytest.raises(UserError, match="no answer within 2 s"):
            chat.check()
        assert time.monotonic() - start < 3.5


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


def test_the_snoop_kernel_finds_a_key_it_can_see(spec, tmp_path, monkeypatch):
    """The control: where a process holding the secret is visible, the kernel finds it and is wrong. A worker
    started by root runs as a user id of its own and sees only that user's processes (forge.evaluate.privilege):
    here that id is named (FORGE_WORKER_USER=uid:gid), and the decoy runs as it too. Landlock is off for the
    control: a process under it may not read the /proc files (environ, mem) of one outside its domain, even of
    its own user, and with it on the same snoop finds nothing."""
    from forge.evaluate import landlock
    from forge.evaluate.privilege import account, release_id

    secret = "sk-forge-leaktest-" + secrets.token_hex(8)
    monkeypatch.setenv("FORGE_LANDLOCK", "0")
    who = account()  # None where forge is not root: the worker is forge's user, as the decoy is
    if who:
        release_id(who[0])  # a fresh id, named for the worker below rather than claimed
        monkeypatch.setenv("FORGE_WORKER_USER", f"{who[0]}:{who[1]}")
    as_worker = {"user": who[0], "group": who[1], "extra_groups": []} if who else {}
    decoy = subprocess.Popen(["sleep", "120"], env={"PATH": os.environ["PATH"], "SOME_API_KEY": secret}, **as_worker)
    try:
        with Evaluator("cpu", bench=FAST) as ev:
            seen = ev.evaluate(spec, Candidate("cpu", SNOOP + "// with a decoy\n"))
        if landlock.abi() >= 2:  # and with Landlock on, the same decoy of the same user is out of its reach
            monkeypatch.setenv("FORGE_LANDLOCK", "1")
            with Evaluator("cpu", bench=FAST) as ev:
                fenced = ev.evaluate(spec, Candidate("cpu", SNOOP + "// with a decoy, under Landlock\n"))
            assert fenced.status.passed, fenced.message
    finally:
        decoy.kill()
        decoy.wait()
    with Evaluator("cpu", bench=FAST) as ev:
        clean = ev.evaluate(spec, Candidate("cpu", SNOOP + "// without\n"))
    assert not seen.status.passed and seen.status not in (Status.BUILD_ERROR, Status.FORBIDDEN_IO), seen.message
    assert clean.status.passed, clean.message


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_no_process_forge_starts_holds_a_key(wire, tmp_path):
    """A real run in each wire format: the keys in forge's environment, the server requiring one, the snoop kernel
    the answer: it passes in the workers and matches eager in the end-to-end check (in the optimize process):
    it saw no key."""
    secret = "sk-forge-leaktest-" + secrets.token_hex(8)
    db, out = tmp_path / "forge.db", tmp_path / "report.json"
    with FakeLLM(snoop_answer, key=secret) as server:
        policy, env = keyed(wire, server, secret)
        env = {"OPENAI_API_KEY": secret, "ANTHROPIC_API_KEY": secret, "GITHUB_TOKEN": secret, **env}
        r = forge(["optimize", str(MODELS / "pointwise_chain.py"), "--policy", policy, "--budget", "4",
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


# the two wire formats through the key holder: the key in forge's environment, the server requiring it
KEYED = {"openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL", "/v1", "openai:gpt-4o-mini"),
         "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "", "anthropic:claude-test-model")}


def keyed(wire, server, secret):
    """(--policy, environment) of a run through the key holder against `server` in `wire`'s format."""
    key, url, path, policy = KEYED[wire]
    return policy, {key: secret, url: server.url + path}


def stall(prompt):
    """A server that never answers some requests and sends others a byte a second, never finishing."""
    if "different approach" in prompt:
        return [Step(fault="drip")]
    if "vectorised inner loops" in prompt:
        return [Step(fault="drip-body")]
    return [Step(fault="hang")]


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["keyless", "openai", "anthropic"])
def test_a_hanging_server_ends_a_60_second_run_within_90(wire, tmp_path):
    """Keyless (the job's own process sends), and through the key holder in both formats: requests that hang
    and requests that drip a byte a second all end by the deadline, and no thread keeps a process alive."""
    db = tmp_path / "forge.db"
    secret = "sk-forge-hang-" + secrets.token_hex(4)
    with FakeLLM(stall, key="" if wire == "keyless" else secret) as server:
        policy, env = (f"openai-compatible:{server.url}/v1:fake-coder", {}) if wire == "keyless" else \
            keyed(wire, server, secret)
        start = time.monotonic()
        r = forge(["optimize", str(MODELS / "sincos_erf.py"), "--policy", policy, "--seconds", "60", "--no-inductor",
                   "--db", str(db), "--out", str(tmp_path / "runs")], {**env, "FORGE_CACHE": str(tmp_path / "cache")},
                  timeout=200)
        took = time.monotonic() - start
        prompts = [s.prompt for s in server.completions()]
        assert all(s.status == 200 for s in server.completions())  # the key reached the server
    assert r.returncode == 0, r.stderr
    assert took < 90, took
    sent = [f[0].fault for f in map(stall, prompts)]
    assert {"hang", "drip", "drip-body"} <= set(sent), sent  # requests that hang and that drip were sent
    store = Store(db)
    (run,) = store.list_runs()
    failed = [c for t in store.get_tasks(run.id) for c in store.candidates(t.id) if c.parent_id is not None]
    assert failed and {c.status for c in failed} <= {"provider_error", "not_asked"}, {c.status for c in failed}
    print(f"{wire}: the --seconds 60 run took {took:.1f} s")


@pytest.mark.parametrize("cls,provider,path", WIRES, ids=IDS)
def test_the_key_holder_ends_a_request_by_the_runs_deadline_whatever_the_child_asks(cls, provider, path):
    """The child asks for 1000 s; the key holder's run ends in 3 s: the request (a server dripping a byte a
    second) ends then, counted at its worst case."""
    with FakeLLM(lambda p: [Step(fault="drip-body")]) as server:
        chat = chat_of(cls, provider, path, server, Price(1.0, 1.0))
        ours, theirs = socket.socketpair()
        start = time.monotonic()
        holder = threading.Thread(target=broker.serve, args=(ours, chat), kwargs={"deadline": start + 3.0})
        holder.start()
        ask = {"id": 1, "system": "s", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100,
               "seconds_left": 1000}
        theirs.sendall(json.dumps(ask).encode() + b"\n")
        answer = json.loads(theirs.makefile("rb").readline())
        took = time.monotonic() - start
        theirs.close()  # the child is done: the key holder stops serving
        holder.join(5)
    assert took < 4.5 and answer["status"] == "provider_error" and "cut" in answer["error"], (took, answer)
    assert answer["spent"] > 0 and not holder.is_alive()


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_max_usd_holds_through_the_key_holder_even_when_the_provider_overreports(wire, tmp_path):
    """$100 per million tokens: a request's worst case (its prompt bytes and 8192 tokens out) is about $2, so
    --max-usd 5 has room for two in flight; the server reports 50,000 tokens out for every answer ($5 each as
    reported). The key holder charges each at most its reservation: never past $5, requests in flight
    included, and the search stops on the budget."""
    secret = "sk-forge-usd-" + secrets.token_hex(4)
    db, prices, out = tmp_path / "forge.db", tmp_path / "prices.json", tmp_path / "report.json"
    prices.write_text(json.dumps({"openai": {"gpt-4o-mini": {"in": 100.0, "out": 100.0}},
                                  "anthropic": {"claude-test-model": {"in": 100.0, "out": 100.0}}}))
    with FakeLLM(lambda p: [Step(f"```cpp\n{GOOD}```\n", tokens_out=50_000, sleep_s=1.0)], key=secret) as server:
        policy, env = keyed(wire, server, secret)
        r = forge(["optimize", str(MODELS / "sincos_erf.py"), "--policy", policy, "--max-usd", "5", "--prices",
                   str(prices), "--budget", "12", "--seconds", "120", "--no-inductor", "--db", str(db), "--out",
                   str(tmp_path / "runs"), "--json", str(out)], {**env, "FORGE_CACHE": str(tmp_path / "cache")})
        answered = [s for s in server.completions() if s.status == 200]
    assert r.returncode == 0, r.stderr
    store = Store(db)
    (run,) = store.list_runs()
    calls = store.llm_calls(run.id)
    cost = store.run_cost(run.id)
    assert 0 < cost.usd <= 5.0 and json.loads(out.read_text())["cost"]["usd"] == pytest.approx(cost.usd)
    assert len(calls) == len(answered) >= 2 and server.max_in_flight >= 2  # requests were in flight together
    assert all(c.status == "overreported" and c.tokens_out == 50_000 for c in calls)
    assert all(c.usd == pytest.approx(Price(100.0, 100.0).cost(c.tokens_in, 8192)) for c in calls)
    assert any(t.stop_reason.startswith("LLM budget spent") for t in store.get_tasks(run.id))


@pytest.mark.slow
def test_a_kernel_loaded_after_the_search_cannot_reach_the_key_holder(tmp_path):
    """The spend kernel is correct and, in the job's process (the end-to-end check), writes an LLM request of its
    own to the descriptor of the channel to the key holder: closed when the search ended, it reaches nothing."""
    secret = "sk-forge-spend-" + secrets.token_hex(4)
    db, out, tried = tmp_path / "forge.db", tmp_path / "report.json", tmp_path / "spend.log"
    spend = (Path(__file__).parent / "llm" / "spend.cpp").read_text()
    with FakeLLM(lambda p: [Step(f"```cpp\n{spend}```\n")], key=secret) as server:
        policy, env = keyed("openai", server, secret)
        r = forge(["optimize", str(MODELS / "pointwise_chain.py"), "--policy", policy, "--budget", "4", "--seconds",
                   "120", "--no-inductor", "--db", str(db), "--out", str(tmp_path / "runs"), "--json", str(out)],
                  {**env, "FORGE_CACHE": str(tmp_path / "cache"), "FORGE_SPEND_LOG": str(tried)})
        prompts = [s.prompt for s in server.completions()]
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    ran = [m for m in report["variants"] if m["variant"]["kernels"] and not m["variant"]["rewrites"]]
    assert ran and all(m["match"] for m in ran), ran  # the kernel ran in the job's process
    assert tried.read_text().startswith("fd "), "the kernel never tried"  # it wrote its request there...
    assert prompts and not any("SPENT-BY-A-KERNEL" in p for p in prompts)  # ...and it reached no server
    assert len(Store(db).llm_calls(report["run_id"])) == len(prompts)


def tree(store, run_id):
    """Every candidate of a run: (task, source, status), sorted (answers arrive in any order)."""
    return sorted((t.key, c.source, c.status) for t in store.get_tasks(run_id) for c in store.candidates(t.id)
                  if c.parent_id is not None)


def bank(prompt):
    """A fixed bank: the good kernel, a refusal, a request the server rejects (an error), a wrong kernel;
    repairs and optimizations get the good kernel."""
    if "Make it faster" in prompt or "by the compiler" in prompt or "wrong_result" in prompt:
        return [Step(f"Fixed.\n\n```cpp\n{GOOD}```\n")]
    if "different approach" in prompt:
        return [Step("I can't help with that.", fault="refusal")]
    if "vectorised inner loops" in prompt:
        return [Step(fault="400")]
    if "cache blocking" in prompt:
        return [Step(f"```cpp\n{GOOD.replace('sinf(x[i])', 'sinf(x[i] + 1)')}```\n")]  # wrong
    return [Step(f"```cpp\n{GOOD}```\n")]


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_replay_from_the_run_id_alone_offline_without_a_key(wire, tmp_path):
    """A run through the key holder, then `forge optimize --replay RUN` and nothing else (no model, budget or
    seconds, no key, the server gone): the same tree, sources and statuses, the refusal refused again and
    the error an error again."""
    db = tmp_path / "forge.db"
    # 4 candidates: the root's first attempts, whatever the timings (deeper, the tree follows measured times)
    common = ["--no-inductor", "--db", str(db), "--out", str(tmp_path / "runs")]
    env = {"FORGE_CACHE": str(tmp_path / "cache")}
    with FakeLLM(bank, key="sk-forge-replay") as server:
        policy, keys = keyed(wire, server, "sk-forge-replay")
        first = forge(["optimize", str(MODELS / "sincos_erf.py"), "--policy", policy, "--budget", "4",
                       "--seconds", "120", *common], {**env, **keys})
    assert first.returncode == 0, first.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert run.policy == policy
    again = forge(["optimize", "--replay", run.id, *common], env)  # server stopped, no key
    assert again.returncode == 0, again.stderr
    replayed = next(r for r in store.list_runs() if r.id != run.id)
    assert replayed.policy == run.policy and replayed.model == run.model and replayed.config["budget"] == \
        run.config["budget"]
    assert tree(store, replayed.id) == tree(store, run.id) and tree(store, run.id)
    assert {"ok", "refused", "provider_error", "wrong_result"} <= {status for _, _, status in tree(store, run.id)}
    as_replayed = {"ok": "replayed", "refusal": "replayed-refusal", "error": "replayed-error"}
    assert sorted(as_replayed[c.status] for c in store.llm_calls(run.id)) == \
        sorted(c.status for c in store.llm_calls(replayed.id))
    assert store.run_cost(replayed.id).usd == 0


@pytest.mark.slow
def test_replay_alone_measures_what_the_run_measured_no_inductor_included(tmp_path):
    """A keyless --no-inductor run, then `forge optimize --replay RUN` alone: the replay measures no
    torch.compile variant either (the run's setting is stored with it)."""
    db, report = tmp_path / "forge.db", tmp_path / "r.json"
    common = ["--db", str(db), "--out", str(tmp_path / "runs"), "--json", str(report)]
    env = {"FORGE_CACHE": str(tmp_path / "cache")}
    with FakeLLM(bank) as server:
        first = forge(["optimize", str(MODELS / "sincos_erf.py"), "--policy",
                       f"openai-compatible:{server.url}/v1:fake-coder", "--budget", "2", "--seconds", "120",
                       "--no-inductor", *common], env)
    assert first.returncode == 0, first.stderr
    store = Store(db)
    (run,) = store.list_runs()
    again = forge(["optimize", "--replay", run.id, *common], env)  # no --no-inductor: the run's own
    assert again.returncode == 0, again.stderr
    measured = [m["variant"]["runtime"] for m in json.loads(report.read_text())["variants"]]
    assert measured and not any(r.startswith("inductor") for r in measured), measured
    replayed = next(r for r in store.list_runs() if r.id != run.id)
    assert run.config["inductor"] is False and replayed.config["inductor"] is False


@pytest.mark.parametrize("args,says", [
    (["--replay", "r-nope"], "no run 'r-nope' to replay"),
    (["--replay", "RECIPES"], "it made no LLM calls to replay"),
    (["--replay", "EVAL"], "only optimize runs replay"),
])
def test_a_run_that_cannot_be_replayed_is_one_line(args, says, tmp_path):
    store = Store(tmp_path / "forge.db")
    runs = {"RECIPES": store.create_run("m.py", device="cpu", policy="recipes", config={"budget": {}}).id,
            "EVAL": store.create_run("m.py", device="cpu", policy="openai:gpt-4o-mini").id}
    r = forge(["optimize", *[runs.get(a, a) for a in args], "--db", str(tmp_path / "forge.db")], {}, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
