"""Searches through the LLM policy: the real SDK clients against a local fake server, real builds and workers.

The scripted model answers the sin-cos-erf task with a good kernel, a broken one, a cheating one (ATen) that it
repeats when asked to fix it, a prose answer and then a cheating one (a cached result), and repairs or
optimizes whatever it is shown. Every test checks what was stored, what it cost, and where the answers
came from.
"""

import json
import logging
import os
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MODELS, ROOT
from llm_server import FakeLLM, Step
from markupsafe import escape
from review_store import start_ui

from forge.bench import BenchConfig
from forge.capture.model_input import load_file
from forge.capture.profile import profile_model
from forge.cli import main
from forge.evaluate.evaluator import Evaluator
from forge.kernel import normal_form
from forge.policy.llm import LLMConfig, MixedPolicy, RetryConfig, make_llm_policy
from forge.policy.llm.prices import PriceTable
from forge.search.driver import Budget, search
from forge.store import Store
from forge.store.recorder import StoreRecorder

KERNELS = {p.stem: p.read_text() for p in (Path(__file__).parent / "llm").glob("*.cpp")}
FAST = BenchConfig(warmup_s=0.005, budget_s=0.03, min_runs=3, max_runs=20)
CONFIG = LLMConfig(width=4, max_first=4, optimize=2, rounds=1, concurrency=4)
# one batch of 4 first attempts, then every expansion of them at once: 2 optimize + 3 repairs
BUDGET = Budget(candidates=9, per_task=9, min_per_task=9, patience=100, parallel=16, min_share=0.0, seconds=300)
RETRY = RetryConfig(attempts=4, base_s=0.01, timeout_s=5.0)
SECRET = "sk-test-DO-NOT-LEAK-4f1c9a"


def code(name: str, words: str = "Here is the kernel.") -> str:
    return f"{words}\n\n```cpp\n{KERNELS[name]}```\n"


def script(prompt: str) -> list[Step]:
    """What the fake model answers to a prompt (its last user message); first attempts take 0.3 s to come."""
    steps = answers(prompt)
    return [replace(s, sleep_s=0.3) for s in steps] if prompt.startswith("## Task") else steps


def answers(prompt: str) -> list[Step]:
    if "could not be used" in prompt:  # the format-repair turn: the cheater insists, the chatty one complies
        return [Step(code("torch_call") if "forbidden_torch" in prompt else code("stale"))]
    if "by the compiler" in prompt or "by the static checks" in prompt or "**wrong_result**" in prompt:
        return [Step(code("good", "Fixed."))]
    if "**stale_result**" in prompt or "Make it faster" in prompt:
        return [Step(code("faster", "Vectorised the inner loop."))]
    if "different approach" in prompt:
        return [Step(fault="429", retry_after="0"), Step(fault="500"), Step(code("broken"))]
    if "vectorised inner loops" in prompt:
        return [Step(code("torch_call", "ATen already has this."))]
    if "cache blocking" in prompt:
        return [Step("Use OpenMP and a cache of the result; that is all it takes.")]
    return [Step(code("good"))]


@pytest.fixture(scope="module")
def tasks():
    prof, _ = profile_model(load_file(MODELS / "sincos_erf.py"), budget_s=0.05)
    return list(prof.tasks)


@pytest.fixture(scope="module")
def ev():
    # a fixed verification seed: the second run must see the very prompts of the first (evaluation messages
    # carry error values) to be served from the cache; a kernel's static state outlives its evaluation in
    # the worker, so the inputs must match too
    with Evaluator("cpu", bench=FAST, seed=0) as e:
        yield e


def run_search(policy, tasks, ev, store, budget=BUDGET):
    run = store.create_run("sincos", device="cpu", dtype="float32", policy=policy.name)
    policy.bind(store, run.id)
    try:
        outcomes = search(tasks, policy, ev, StoreRecorder(store, run.id), budget)
    finally:
        policy.close()
    return run.id, outcomes


def statuses(store, run_id):
    """Evaluation statuses of every stored candidate of the run (root excluded)."""
    return [c.status for t in store.get_tasks(run_id) for c in store.candidates(t.id) if c.parent_id is not None]


def assert_no_source_evaluated_twice(store, run_id):
    """Every evaluated (not duplicate) node of a task has a source of its own, comments and spacing aside."""
    for t in store.get_tasks(run_id):
        done = [c for c in store.candidates(t.id) if c.parent_id is not None and c.status != "duplicate"]
        forms = [normal_form(c.source, "//") for c in done if "forge: no kernel" not in c.source]
        assert len(forms) == len(set(forms)), [c.status for c in done]


PROVIDERS = [("openai", "OPENAI_BASE_URL", "/v1", "gpt-4o-mini"),
             ("anthropic", "ANTHROPIC_BASE_URL", "", "claude-test-model"),
             ("openai-compatible", None, "/v1", "fake-coder")]


def policy_name(provider, model, server):
    return f"openai-compatible:{server.url}/v1:{model}" if provider == "openai-compatible" else f"{provider}:{model}"


@pytest.mark.parametrize("provider,url_env,path,model", PROVIDERS, ids=[p[0] for p in PROVIDERS])
def test_search_through_provider_costs_tokens_times_price_then_zero_from_cache(
        provider, url_env, path, model, tasks, ev, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({provider: {model: {"in": 3.0, "out": 15.0}}}))
    monkeypatch.setenv({"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}.get(
        provider, "OPENAI_COMPATIBLE_API_KEY"), SECRET)
    store = Store(tmp_path / "forge.db")
    with FakeLLM(script, key=SECRET) as server:
        if url_env:
            monkeypatch.setenv(url_env, server.url + path)
        name = policy_name(provider, model, server)

        def make():
            return make_llm_policy(name, "cpu", store=store, prices=prices, retry=RETRY, config=CONFIG)

        run1, outcomes = run_search(make(), tasks, ev, store)
        first_calls = len(server.completions())
        assert server.max_in_flight >= 2  # the first attempts were in flight together
        run2, outcomes2 = run_search(make(), tasks, ev, store)
        assert len(server.completions()) == first_calls  # the second run never reached the server

    got = statuses(store, run1)
    assert len(got) == 9
    # good first attempt and the faster kernel pass; the cheats are rejected; the broken one is repaired, into
    # the good kernel again: stored as a duplicate, not evaluated twice
    assert {"build_error", "forbidden_torch", "stale_result", "duplicate"} <= set(got) and got.count("ok") == 2
    assert_no_source_evaluated_twice(store, run1)
    assert outcomes[0].best_us is not None and outcomes[0].stop_reason.startswith("budget (9")
    calls = store.llm_calls(run1)
    assert len(calls) == 11 and all(c.status == "ok" for c in calls)  # 9 nodes + 2 format repairs
    price = PriceTable(prices).get(provider, model)
    served = [s for s in server.completions() if s.status == 200]
    assert sum(c.tokens_in for c in calls) == sum(s.tokens_in for s in served) > 0
    assert sum(c.tokens_out for c in calls) == sum(s.tokens_out for s in served) > 0
    cost = store.run_cost(run1)
    assert cost.usd == pytest.approx(sum(price.cost(c.tokens_in, c.tokens_out) for c in calls)) and cost.usd > 0
    assert cost.usd == pytest.approx((cost.tokens_in * 3.0 + cost.tokens_out * 15.0) / 1e6)

    assert statuses(store, run2) == got  # the same tree, every answer from the cache, free
    again = store.llm_calls(run2)
    assert len(again) == 11 and {c.status for c in again} == {"cached"}
    assert store.run_cost(run2).usd == 0.0 and outcomes2[0].best_us is not None

    # the key went to the server only: not in a log record, the store's file, or a request we stored
    assert all(SECRET in (s.headers.get("authorization", "") + s.headers.get("x-api-key", "")) for s in served)
    assert SECRET not in caplog.text
    store.close()
    for f in tmp_path.glob("forge.db*"):
        assert SECRET.encode() not in f.read_bytes()


def test_cheating_answers_are_rejected_and_repairs_see_why(tasks, ev, tmp_path):
    store = Store(tmp_path / "forge.db")
    with FakeLLM(script) as server:
        run, _ = run_search(make_llm_policy(f"openai-compatible:{server.url}/v1:fake-coder", "cpu", store=store,
                                            retry=RETRY, config=CONFIG), tasks, ev, store)
        prompts = [s.prompt for s in server.completions()]
    task = store.get_tasks(run)[0]
    by_status = {}
    for c in store.candidates(task.id):
        by_status.setdefault(c.status, []).append(c)
    assert "at::add_out" in by_status["forbidden_torch"][0].source  # stored as answered, never built
    assert "cache[i]" in by_status["stale_result"][0].source
    ev_torch = store.evaluations(by_status["forbidden_torch"][0].id)[0]
    assert "calls into PyTorch/ATen" in ev_torch.message and not ev_torch.build_log
    # the cheater got one format-repair turn naming the rule, then the search a repair with the checks' words
    assert any("could not be used: forbidden_torch" in p for p in prompts)
    assert any("by the static checks" in p and "calls into PyTorch/ATen" in p for p in prompts)
    assert any("**stale_result**" in p and "same output" in p for p in prompts)
    build = next(p for p in prompts if "by the compiler" in p)
    assert "error" in build and "/tmp" not in build and "kernel.cpp" in build  # the log, without build folders
    opt = next(p for p in prompts if "Make it faster" in p)
    assert "roofline floor" in opt and "% of it" in opt and "OpenMP runs" in opt and "Recent attempts" in opt


def test_replay_answers_from_the_stored_run_only(tasks, ev, tmp_path):
    store = Store(tmp_path / "forge.db")
    with FakeLLM(script) as server:
        name = f"openai-compatible:{server.url}/v1:fake-coder"
        run1, _ = run_search(make_llm_policy(name, "cpu", store=store, retry=RETRY, config=CONFIG), tasks, ev,
                             store)
    # the server is gone: a replay must not need it
    run2, outcomes = run_search(make_llm_policy(name, "cpu", store=store, replay=run1, config=CONFIG), tasks, ev,
                                store)
    assert statuses(store, run2) == statuses(store, run1) and outcomes[0].best_us is not None
    assert {c.status for c in store.llm_calls(run2)} == {"replayed"} and store.run_cost(run2).usd == 0
    # a wider search asks what run1 never asked: those nodes fail with the reason, nothing reaches a network
    wider = LLMConfig(width=5, max_first=5, optimize=2, rounds=1, concurrency=4)
    run3, _ = run_search(make_llm_policy(name, "cpu", store=store, replay=run1, config=wider), tasks, ev, store,
                         replace(BUDGET, candidates=10, per_task=10))
    misses = [c for t in store.get_tasks(run3) for c in store.candidates(t.id) if "no stored answer" in c.source]
    assert misses and all(c.status == "not_asked" for c in misses)


def test_max_usd_stops_the_search_cleanly(tasks, ev, tmp_path):
    # $1000 per million tokens out: a request's worst case (8192 tokens) is $8.19, a real answer (a few hundred
    # tokens) well under $1; $8.5 has room for one request at a time, and for none once $0.31 is spent
    store = Store(tmp_path / "forge.db")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai-compatible": {"fake-coder": {"in": 0.0, "out": 1000.0}}}))
    with FakeLLM(script) as server:
        pol = make_llm_policy(f"openai-compatible:{server.url}/v1:fake-coder", "cpu", store=store, prices=prices,
                              max_usd=8.5, retry=RETRY, config=CONFIG)
        run, outcomes = run_search(pol, tasks, ev, store)
    assert outcomes[0].stop_reason.startswith("LLM budget spent")
    assert "--max-usd 8.5" in outcomes[0].stop_reason
    cost = store.run_cost(run)
    assert 0 < cost.usd <= 8.5 and cost.llm_calls >= 1  # never past the cap, in-flight requests included
    assert "not_asked" in statuses(store, run)  # the requests it had no room for were not sent
    assert store.get_tasks(run)[0].stop_reason.startswith("LLM budget spent")


def test_mixed_policy_seeds_with_recipes_and_tunes_llm_kernels(tasks, ev, tmp_path):
    """Driven by hand (propose, render, evaluate, observe) so the steps are deterministic; the search does the same."""
    from forge.kernel import TaskSpec
    from forge.policy.llm import Idea

    store = Store(tmp_path / "forge.db")
    spec = TaskSpec.of(tasks[0])
    with FakeLLM(lambda p: [Step(code("faster" if "Make it faster" in p else "good"))]) as server:
        pol = make_llm_policy(f"recipes+openai-compatible:{server.url}/v1:fake-coder", "cpu", store=store,
                              retry=RETRY, config=LLMConfig(width=1, max_first=1, optimize=1, rounds=1, tune=True))
        assert isinstance(pol, MixedPolicy) and pol.name == f"recipes+openai-compatible:{server.url}/v1:fake-coder"
        pol.bind(store, store.create_run("sincos", device="cpu", policy=pol.name).id)

        def judge(payloads):
            cands = [pol.render(spec, p) for p in payloads]
            results = list(ev.evaluate_many(spec, cands))
            for p, c, r in zip(payloads, cands, results, strict=True):
                pol.observe(spec, p, c, r)
            return cands, results

        root = pol.propose(spec, None)
        llm = [p for p in root if isinstance(p, Idea)]
        recipes = [p for p in root if not isinstance(p, Idea)]
        assert len(llm) == 1 and len(recipes) >= 2 and root[1] == llm[0]  # recipes seed the tree, interleaved
        cands, results = judge(root)
        assert all(r.status.passed for r in results), [(r.status.value, r.message) for r in results]
        times = {p: r.timing.median_us for p, r in zip(root, results, strict=True)}
        best_recipe = min(recipes, key=times.get)
        # below the recipes' best, the LLM is asked to improve the recipe's kernel
        below = pol.propose(spec, best_recipe)
        seeded = [p for p in below if isinstance(p, Idea)]
        assert [p.kind for p in seeded] == ["optimize"] and any(not isinstance(p, Idea) for p in below)
        assert pol.render(spec, seeded[0]).source == KERNELS["faster"]
        recipe_src = cands[root.index(best_recipe)].source.strip()
        assert any("Make it faster" in s.prompt and recipe_src in s.prompt for s in server.completions())
        assert not any(isinstance(p, Idea) for p in pol.propose(spec, max(recipes, key=times.get)))  # best only
        # below the LLM's kernel: its optimization, and recipe-style tuning of its FORGE_KNOB_ constants
        kids = pol.propose(spec, llm[0])
        tunes = {p.note: pol.render(spec, p) for p in kids if p.kind == "tune"}
        assert [p.kind for p in kids if p.kind != "tune"] == ["optimize"]
        assert set(tunes) == {"BLOCK=8192", "BLOCK=2048", "fast_math=on"}
        assert "#define FORGE_KNOB_BLOCK 8192" in tunes["BLOCK=8192"].source
        assert tunes["fast_math=on"].flags == ("-ffast-math",)
        _, tuned = judge([p for p in kids if p.kind == "tune"])
        assert all(r.status.passed for r in tuned)
        pol.close()


def test_cli_optimize_through_openai_then_replay_without_network_or_key(tmp_path, monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.chdir(tmp_path)  # runs/ lands here
    db, out = tmp_path / "forge.db", tmp_path / "report.json"
    model = str(MODELS / "sincos_erf.py")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with FakeLLM(script, key=SECRET) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        assert main(["optimize", model, "--policy", "openai:gpt-4o-mini", "--budget", "4", "--max-usd", "5",
                     "--db", str(db), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["policy"] == "openai:gpt-4o-mini" and report["outputs_match"]
    store = Store(db)
    calls = store.llm_calls(report["run_id"])
    price = PriceTable().get("openai", "gpt-4o-mini")  # the shipped table
    assert report["cost"]["usd"] == pytest.approx(sum(price.cost(c.tokens_in, c.tokens_out) for c in calls))
    assert report["cost"]["usd"] > 0
    assert report["cost"]["tokens_in"] == sum(c.tokens_in for c in calls)
    # every call is linked to the node its answer became, by the search (nothing here sets a link), and
    # `forge show` shows that node's prompt and answer
    assert calls and all(c.candidate_id is not None for c in calls)
    assert all(c.task_id is not None for c in calls)  # and, through it, to its task
    node = calls[0].candidate_id
    capsys.readouterr()
    assert main(["show", report["run_id"], str(node), "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert "prompt" in shown and "answer" in shown
    assert calls[0].response.strip().splitlines()[0].strip()[:40] in shown
    # and so does the UI's node panel (the fragment the task page swaps in), served by `forge ui`
    ui = start_ui(db, tmp_path / "ui.log")
    try:
        with urllib.request.urlopen(f"{ui.url}/fragments/nodes/{node}", timeout=30) as r:
            panel = r.read().decode()
    finally:
        ui.stop()
    mine = [c for c in calls if c.candidate_id == node]
    assert "<h4>Prompt</h4>" in panel and "<h4>Answer</h4>" in panel
    for c in mine:
        assert escape(c.prompt.strip().splitlines()[-1].strip()[:40]) in panel
        assert escape(c.response.strip().splitlines()[0].strip()[:40]) in panel

    monkeypatch.delenv("OPENAI_API_KEY")
    out2 = tmp_path / "replay.json"
    assert main(["optimize", model, "--replay", report["run_id"], "--budget", "4", "--db", str(db),
                 "--json", str(out2)]) == 0
    replay = json.loads(out2.read_text())
    assert replay["policy"] == "openai:gpt-4o-mini" and replay["cost"]["usd"] == 0
    assert {c.status for c in store.llm_calls(replay["run_id"])} == {"replayed"}

    captured = capsys.readouterr()
    store.close()
    for text in (out.read_text(), out2.read_text(), captured.out, captured.err, caplog.text):
        assert SECRET not in text
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f


CHAIN = {p.stem: p.read_text() for p in (Path(__file__).parent / "llm" / "chain").glob("*.cpp")}


def recommented(source: str) -> str:
    """The same program with other comments: a first line of its own, a block comment, a trailing note."""
    head, rest = source.split("\n", 1)
    return f"// {head.removeprefix('// ')} (second answer)\n/* the same kernel,\n   told again */\n" + \
        rest.replace("return 0;", "return 0;  // done")


def respaced(source: str) -> str:
    """The same program spaced otherwise: tabs for indentation, wider operators, blank lines."""
    return source.replace("  ", "\t").replace(" = ", "   =   ").replace("{\n", "{\n\n")


def bank(prompt: str) -> list[Step]:
    """A fixed bank for the pointwise chain: first attempts are correct but slow, not compiling, wrong (the tail),
    or the slow one again with other comments and spacing; a repair answers the slow one respaced or recommented;
    asked to make the slow one faster, the fast one; asked to make the fast one faster, the fast one recommented."""
    if "Make it faster" in prompt:
        slow_shown = "i * cols + j" in prompt
        return [Step(code_of(CHAIN["fast"] if slow_shown else recommented(CHAIN["fast"]), "Vectorised, one pass."))]
    if "by the compiler" in prompt:
        return [Step(code_of(respaced(CHAIN["slow"]), "Fixed the typo."))]
    if "**wrong_result**" in prompt:
        return [Step(code_of(recommented(CHAIN["slow"]), "Fixed the remainder."))]
    if "different approach" in prompt:
        return [Step(code_of(CHAIN["broken"]))]
    if "vectorised inner loops" in prompt:
        return [Step(code_of(CHAIN["tail"]))]
    if "cache blocking" in prompt:
        return [Step(code_of(respaced(recommented(CHAIN["slow"]))))]
    return [Step(code_of(CHAIN["slow"]))]


def code_of(source: str, words: str = "Here is the kernel.") -> str:
    return f"{words}\n\n```cpp\n{source}```\n"


@pytest.mark.slow
def test_a_bank_of_kernels_finds_and_applies_the_fast_one_within_the_default_budget_evaluating_no_source_twice(
        tmp_path):
    """`forge optimize` as a user runs it (the default budget, --seconds 120) against a server answering from a
    fixed bank: the fast kernel is found and applied; answers that differ from an earlier one only in comments
    and spacing are stored as duplicates, never evaluated again."""
    db, out = tmp_path / "forge.db", tmp_path / "report.json"
    with FakeLLM(bank) as server:
        r = run_forge(["optimize", str(MODELS / "pointwise_chain.py"), "--policy",
                       f"openai-compatible:{server.url}/v1:fake-coder", "--seconds", "120", "--no-inductor",
                       "--db", str(db), "--out", str(tmp_path / "runs"), "--json", str(out)],
                      {"FORGE_CACHE": str(tmp_path / "cache")})
        prompts = [s.prompt for s in server.completions()]
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["applied"] and report["variant"]["kernels"] and report["outputs_match"], report["variant"]
    manifest = json.loads((Path(report["artifact"]) / "manifest.json").read_text())
    (applied,) = manifest["kernels"]
    assert (Path(report["artifact"]) / applied["kernel_source"]).read_text() == CHAIN["fast"]  # the fast one
    store = Store(db)
    (task,) = store.get_tasks(report["run_id"])
    cands = [c for c in store.candidates(task.id) if c.parent_id is not None]
    got = [c.status for c in cands]
    assert {"ok", "wrong_result", "build_error", "duplicate"} <= set(got), got
    assert sorted(c.source for c in cands if c.status == "ok") == sorted([CHAIN["slow"], CHAIN["fast"]])
    evaluated = {c.source for c in cands if c.status != "duplicate"}
    reworded = [c for c in cands if c.status == "duplicate" and c.source not in evaluated]
    assert reworded, "no answer differing only in comments or spacing came back"
    for c in reworded:  # each one the duplicate of the evaluated node with its program
        first = store.evaluations(c.id)[0].verify["duplicate_of"]
        original = next(o for o in cands if o.id == first)
        assert normal_form(c.source, "//") == normal_form(original.source, "//") and c.source != original.source
    assert len(cands) <= 16  # the default budget's share of a task (cmd_optimize: per_task 16)
    assert any("tail only" in p and "expected" in p for p in prompts)  # the repair saw where it was wrong
    assert_no_source_evaluated_twice(store, report["run_id"])
    calls = store.llm_calls(report["run_id"])
    assert len(calls) == len(prompts) and all(c.candidate_id is not None for c in calls)  # each paid answer: a node


def run_forge(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`forge ARGS` in its own process, as a user starts it (no key in its environment)."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "CXX", "CC")}
    return subprocess.run([sys.executable, "-m", "forge.cli", *args], env={**base, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=400)
