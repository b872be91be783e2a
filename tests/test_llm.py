"""The LLM pieces on their own: provider specs, prices, parsing, retries and faults through the real SDKs
against a local fake server, the response cache and key hygiene (CLI errors, a worker's environment)."""

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MODELS
from llm_server import FakeLLM, Step

from forge.cli import main
from forge.evaluate.parent import Worker
from forge.kernel import Status
from forge.policy.llm.cache import CallLog
from forge.policy.llm.parse import Malformed, extract_code, parse_answer
from forge.policy.llm.prices import Price, PriceTable
from forge.policy.llm.prompts import Prompt, measured, render_prompt, system_prompt
from forge.policy.llm.providers import AnthropicChat, LLMError, OpenAIChat, ProviderSpec, RetryConfig, retry_after
from forge.policy.llm.tune import knobs, variants
from forge.store import Store

KERNELS = {p.stem: p.read_text() for p in (Path(__file__).parent / "llm").glob("*.cpp")}
FAST = RetryConfig(attempts=5, base_s=0.01, timeout_s=0.5)
SECRET = "sk-ant-api03-DO-NOT-LEAK-77aa"


def test_provider_specs_parse_and_reject():
    assert ProviderSpec.parse("openai:gpt-4.1-mini") == ProviderSpec("openai", "gpt-4.1-mini")
    assert ProviderSpec.parse("anthropic:claude-sonnet-4-5").key_env == "ANTHROPIC_API_KEY"
    s = ProviderSpec.parse("openai-compatible:http://localhost:11434/v1:qwen2.5-coder:7b")
    assert (s.base_url, s.model, s.name) == ("http://localhost:11434/v1", "qwen2.5-coder:7b",
                                             "openai-compatible:http://localhost:11434/v1:qwen2.5-coder:7b")
    assert ProviderSpec.parse("openai-compatible:http://127.0.0.1:8000:llama3:8b").base_url == "http://127.0.0.1:8000"
    for bad in ("gemini:pro", "openai:", "openai-compatible:localhost:8000:m", "openai-compatible:http://h/v1"):
        with pytest.raises(ValueError, match="Invalid policy"):
            ProviderSpec.parse(bad)


def test_prices_match_the_longest_prefix_and_can_be_overridden(tmp_path):
    table = PriceTable()
    assert table.get("openai", "gpt-4o-2024-08-06") == table.get("openai", "gpt-4o") != table.get("openai",
                                                                                                  "gpt-4o-mini")
    assert table.get("openai", "unknown-model") is None and table.price("openai-compatible", "x") == Price(0, 0)
    override = tmp_path / "p.json"
    override.write_text(json.dumps({"openai": {"gpt-4o": {"in": 1.0, "out": 2.0}}}))
    p = PriceTable(override).get("openai", "gpt-4o-mini-2024")
    assert p == PriceTable().get("openai", "gpt-4o-mini")  # untouched entries stay
    assert PriceTable(override).get("openai", "gpt-4o").cost(1_000_000, 500_000) == pytest.approx(2.0)
    override.write_text("{not json")
    with pytest.raises(ValueError, match="Invalid price table"):
        PriceTable(override)


def test_parse_extracts_the_kernel_and_checks_it_before_building():
    good = KERNELS["good"]
    assert parse_answer(f"Plan: blocks.\n```cpp\n{good}```\nDone.", "cpu").source == good
    assert parse_answer(good, "cpu").source == good  # an unfenced answer that is all code
    two = f"```python\nprint(1)\n```\n```c++\n{good}\n```"
    assert extract_code(two, "cpu").strip() == good.strip()
    with pytest.raises(Malformed, match="forbidden_torch") as e:
        parse_answer(f"```cpp\n{KERNELS['torch_call']}```", "cpu")
    assert e.value.candidate is not None and "at::" in e.value.candidate.source
    for text, why in (("", "empty"), ("I would use OpenMP.", "no code block"),
                      ("```python\nprint(1)\n```", "no code block defines `forge_launch`")):
        with pytest.raises(Malformed, match=why) as e:
            parse_answer(text, "cpu")
        assert e.value.candidate is None
    with pytest.raises(Malformed, match="bad_format: defines no `forge_launch`") as e:
        parse_answer("```cpp\nint main() { return 0; }\n```", "cpu")
    assert e.value.candidate is not None


def test_prompts_mask_measurements_in_the_cache_key():
    a = Prompt.of(f"time {measured('12.5')} us")
    assert (a.text, a.key) == ("time 12.5 us", "time # us")
    sys = system_prompt("cpu")
    assert "forge_launch" in sys.text and "forbidden" in sys.text and "stale_result" in sys.text
    fix = render_prompt("repair-format", reason="the answer is empty", backend="cpu", lang="cpp")
    assert "the answer is empty" in fix.text and "```cpp" in fix.text


def test_tuning_doubles_and_halves_knobs_and_toggles_fast_math():
    from forge.kernel import Candidate

    cand = Candidate("cpu", KERNELS["good"])
    assert knobs(cand.source) == {"BLOCK": 4096}
    got = {label: c for label, c in variants(cand)}
    assert set(got) == {"BLOCK=8192", "BLOCK=2048", "fast_math=on"}
    assert "#define FORGE_KNOB_BLOCK 8192" in got["BLOCK=8192"].source and got["fast_math=on"].flags == (
        "-ffast-math",)


def test_retry_after_forms():
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    assert retry_after({"retry-after": "3"}) == 3.0
    assert 0 <= retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({}) is None


CHATS = [(OpenAIChat, "openai-compatible", "/v1"), (AnthropicChat, "anthropic", "")]


@pytest.mark.parametrize("cls,provider,path", CHATS, ids=["openai", "anthropic"])
def test_faults_are_retried_and_429_waits_retry_after(cls, provider, path):
    steps = [Step(fault="429", retry_after="1"), Step(fault="500"), Step(fault="timeout"), Step(fault="malformed"),
             Step("```cpp\nok\n```")]
    with FakeLLM(lambda p: steps) as server:
        # each request's timeout under the fake's 2-s "timeout" step, but not so short that a request the loaded CI
        # machine answers slowly (the SDK's first, building its client) times out too and the steps run out (flaky)
        chat = cls(ProviderSpec(provider, "fake-coder", server.url + path), "k", replace(FAST, timeout_s=1.5))
        reply = chat.complete("system", [{"role": "user", "content": "write it"}], 100)
        seen = server.completions()
    assert reply.text == "```cpp\nok\n```" and reply.tokens_out == len(reply.text) // 4 and reply.tokens_in > 0
    assert len(seen) == 5
    assert seen[1].at - seen[0].at >= 1.0  # the server's retry-after, not the 10 ms backoff
    assert seen[2].at - seen[1].at < 0.5
    assert seen[0].body["messages"][-1]["content"] == "write it"


@pytest.mark.parametrize("cls,provider,path", CHATS, ids=["openai", "anthropic"])
def test_retries_are_bounded(cls, provider, path):
    with FakeLLM(lambda p: [Step(fault="500")]) as server:
        chat = cls(ProviderSpec(provider, "fake-coder", server.url + path), "k",
                   RetryConfig(attempts=3, base_s=0.01, timeout_s=0.5))
        with pytest.raises(LLMError, match="no answer after 3 request"):
            chat.complete("s", [{"role": "user", "content": "x"}], 10)
        assert len(server.completions()) == 3


@pytest.mark.parametrize("cls,provider,path", CHATS, ids=["openai", "anthropic"])
def test_refusals_and_empty_answers_fail_the_request_and_are_stored(cls, provider, path, tmp_path):
    answers = {"a": [Step("I can't help with that.", fault="refusal")], "b": [Step("")], "c": [Step("fine")]}
    store = Store(tmp_path / "f.db")
    run = store.create_run("m")
    with FakeLLM(lambda p: answers[p]) as server:
        spec = ProviderSpec(provider, "fake-coder", server.url + path)
        calls = CallLog(spec, cls(spec, "k", FAST), Price(1.0, 2.0))
        calls.bind(store, run.id)
        system = Prompt("s", "s")
        with pytest.raises(LLMError, match="refused"):
            calls.ask(system, [("user", Prompt("a", "a"))])
        with pytest.raises(LLMError, match="empty"):
            calls.ask(system, [("user", Prompt("b", "b"))])
        assert calls.ask(system, [("user", Prompt("c", "c"))]).source == "network"
        assert calls.ask(system, [("user", Prompt("c", "c"))]).source == "cache"  # identical: from the store
        assert len(server.completions()) == 3
    stored = store.llm_calls(run.id)
    assert [c.status for c in stored] == ["refusal", "empty", "ok", "cached"]
    assert stored[2].usd == pytest.approx((stored[2].tokens_in * 1.0 + stored[2].tokens_out * 2.0) / 1e6)
    assert stored[3].usd == 0 and stored[3].response == "fine"


def test_missing_or_rejected_key_is_one_line_before_any_search(tmp_path, monkeypatch, capsys):
    db = tmp_path / "f.db"
    model = str(MODELS / "sincos_erf.py")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main(["optimize", model, "--policy", "anthropic:claude-sonnet-4-5", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("forge: error: ANTHROPIC_API_KEY is not set")

    with FakeLLM(lambda p: [Step("x")], key="the-right-key") as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        assert main(["optimize", model, "--policy", "anthropic:claude-sonnet-4-5", "--db", str(db)]) == 2
        assert not server.completions()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rejected the API key in ANTHROPIC_API_KEY (HTTP 401)" in err
    assert SECRET not in err
    assert Store(db).list_runs() == []  # nothing was searched, or even started

    assert main(["optimize", model, "--policy", "gemini:pro", "--db", str(db)]) == 2
    assert capsys.readouterr().err.startswith("forge: error: Invalid policy 'gemini:pro'")
    assert main(["optimize", model, "--max-usd", "1", "--db", str(db)]) == 2
    assert "apply to LLM policies" in capsys.readouterr().err


def test_a_worker_gets_no_api_key(monkeypatch):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_COMPATIBLE_API_KEY"):
        monkeypatch.setenv(name, SECRET)
    with Worker("cpu") as w:
        w._start()
        assert w.proc is not None
        env = Path(f"/proc/{w.proc.pid}/environ").read_bytes()
    assert b"PATH=" in env and SECRET.encode() not in env and b"API_KEY" not in env


def test_status_of_a_failed_node_is_bad_format():
    from forge.kernel import NoKernel

    k = NoKernel.because("cpu", "openai:x gave no kernel: it refused")
    assert k.status is Status.BAD_FORMAT and "it refused" in k.source and k.source.startswith("//")


def test_timeouts_fail_within_the_bound():
    with FakeLLM(lambda p: [Step(fault="timeout")]) as server:
        chat = OpenAIChat(ProviderSpec("openai-compatible", "m", server.url + "/v1"), "k",
                          RetryConfig(attempts=2, base_s=0.01, timeout_s=0.3))
        start = time.monotonic()
        with pytest.raises(LLMError, match="Timeout"):
            chat.complete("s", [{"role": "user", "content": "x"}], 10)
    assert time.monotonic() - start < 2.0
