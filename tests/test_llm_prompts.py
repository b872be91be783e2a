"""Prompts: every request kind renders from its template in prompts/llm/ with everything a strong kernel agent
gives its model; answers are read for the last complete block of the right language; the verifier's mismatch
summary and the compiler's report reach the prompts. Real templates, real compiler, real worker."""

import re
import shutil
import types
from pathlib import Path

import pytest
import torch
from conftest import MODELS

from forge.capture.model_input import load_file
from forge.capture.profile import profile_model
from forge.evaluate.build import build
from forge.evaluate.checks import check
from forge.evaluate.evaluator import Evaluator
from forge.evaluate.mismatch import Mismatch, mismatch
from forge.kernel import Candidate, EvalResult, Feedback, Status, TaskSpec, Timing
from forge.policy.llm.cache import CallLog
from forge.policy.llm.facts import compiler_report, cpu_facts, cuda_facts, gpu_facts, without_report
from forge.policy.llm.parse import Malformed, extract_code, parse_answer
from forge.policy.llm.policy import Idea, LLMPolicy, _Node
from forge.policy.llm.prices import PriceTable
from forge.policy.llm.prompts import KINDS, PROMPTS, render_prompt, system_prompt
from forge.policy.llm.providers import ProviderSpec

KERNELS = {p.stem: p.read_text() for p in (Path(__file__).parent / "llm").glob("*.cpp")}
EXAMPLES = Path(__file__).parents[1] / "examples"


@pytest.fixture(scope="module")
def spec():
    """The causal-mask softmax task of the attention example: a bool buffer input, a module with source."""
    prof, _ = profile_model(load_file(EXAMPLES / "masked_softmax_attention.py"), budget_s=0.05)
    return TaskSpec.of(next(t for t in prof.tasks if t.family == "softmax" or "softmax" in t.key))


def _policy(device: str = "cpu") -> LLMPolicy:
    """A policy whose call log has no connection: these tests render prompts and never send one."""
    spec = ProviderSpec.parse("openai-compatible:http://127.0.0.1:9/v1:none")
    return LLMPolicy(CallLog(spec, None, PriceTable().price(spec.provider, spec.model)), device)


def _parent(pol: LLMPolicy, spec: TaskSpec, cand: Candidate, res: EvalResult) -> _Node:
    """A node of `pol` with an answer and a result, and one failed sibling-to-be."""
    from concurrent.futures import Future

    done: Future = Future()
    done.set_result(cand)
    idea = pol._new("first", None, done)
    node = pol._nodes[idea.id]
    node.result, node.summary = res, "blocks of 4096 over OpenMP"
    pol.observe(spec, idea, cand, res)
    t = res.timing.median_us if res.timing else None
    passed = res.status.passed and t is not None
    pol.told(spec, Feedback(res.status.value, res.message, res.speedup, t, None, t if passed else None,
                            res.baseline.median_us if res.baseline else None, res.floor_us, 1,
                            cand if passed else None))  # what the search tells the policy of the task
    return node


def _timed(us: float) -> Timing:
    return Timing(us, us, us, us, 0.0, 10)


def _task_elements(text: str, spec: TaskSpec, device: str = "OpenMP runs") -> None:
    """What every request kind but repair-format shows of the task: the reference and its module, every input
    and output with dtype, shape and strides (inputs random during verification), eager time, share, floor, the
    device, the lineage. The softmax task's causal mask: a bool input, random too."""
    assert spec.source.strip().splitlines()[-1].strip() in text  # the reference
    assert spec.module and spec.module in text and spec.module_source.strip() in text  # its module, with source
    for i, m in enumerate(spec.inputs):
        assert f"`in[{i}]`: {m.dtype}, shape {list(m.shape)}, strides {list(m.stride)}" in text
    assert "random during verification" in text
    if any(m.dtype == "bool" for m in spec.inputs):
        assert "bool" in text and "masked_fill" in text  # the causal mask and where it comes from
    for j, m in enumerate(spec.outputs):
        assert f"`out[{j}]`: {m.dtype}, shape {list(m.shape)}, strides {list(m.stride)}" in text
    assert "eager PyTorch:" in text and f"{100 * spec.share:.1f}% of the model's time" in text
    assert "roofline floor:" in text and str(spec.floor_bytes) in text
    assert device in text and "## Lineage" in text


def test_system_prompt_has_abi_header_example_and_rules():
    for backend, lang in (("cpu", "cpp"), ("cuda", "cuda"), ("triton", "python")):
        text = system_prompt(backend).text
        assert f"```{lang}" in text and "random values during verification" in text and "stale_result" in text
        assert "An example kernel" in text and "relu" in text
        if backend != "triton":
            assert "enum ForgeDtype" in text and "FORGE_BOOL = 8" in text and "one byte per element" in text


def test_every_example_kernel_passes_the_static_checks_and_the_cpu_one_builds(tmp_path):
    for backend, name in (("cpu", "cpu.cpp"), ("cuda", "cuda.cu"), ("triton", "triton.py"), ("helion", "helion.py")):
        cand = Candidate(backend, (PROMPTS / "examples" / name).read_text())
        assert check(cand) == [], (backend, check(cand))
    built = build(Candidate("cpu", (PROMPTS / "examples" / "cpu.cpp").read_text()), cache_dir=tmp_path)
    assert built.ok, built.log
    assert "vectorized" in compiler_report(built.log)  # the vectoriser's report, from the build itself


def test_first_prompt_has_the_whole_task(spec):
    pol = _policy()
    idea = pol.propose(spec, None)[0]
    text = pol._prompt(spec, "first", None, 0, pol._nodes[idea.id]).text
    _task_elements(text, spec)
    assert "No attempt on this task yet" in text and "Write the kernel" in text
    pol.close()


def test_optimize_prompt_has_task_lineage_timing_and_compiler_report(spec, tmp_path):
    pol = _policy()
    cand = Candidate("cpu", KERNELS["good"])
    log = build(cand, cache_dir=tmp_path).log
    res = EvalResult(Status.OK, build_log=log, timing=_timed(40.0), baseline=_timed(100.0), floor_us=10.0)
    parent = _parent(pol, spec, cand, res)
    ideas = pol.propose(spec, parent.idea)
    failed = pol._nodes[ideas[1].id]
    failed.future.set_result(Candidate("cpu", KERNELS["broken"]))
    failed.result = EvalResult(Status.BUILD_ERROR, "kernel.cpp:6:3: error: expected ';'")
    text = pol._prompt(spec, "optimize", parent, 0, pol._nodes[ideas[0].id]).text
    _task_elements(text, spec)
    assert "Make it faster" in text and "this kernel: 40.00 us" in text and "100.00 us" in text
    assert "reaches 25% of it" in text  # floor 10 us of 40 us
    assert f"code {cand.digest[:8]}" in text and "ok, 40.00 us" in text  # the parent, its digest and time
    assert "Its other children" in text and "build_error" in text  # the failed sibling
    assert "The compiler's report" in text and "line " in text and "vectoriz" in text
    # the traffic its time implies (10 us floor of 40: a quarter of the measured bandwidth): not memory-bound
    achieved = spec.floor_bytes / 40.0 / 1e3
    assert f"memory traffic: {achieved:.1f} GB/s achieved" in text and f"of the {4 * achieved:.1f} GB/s" in text
    assert "far from the memory floor" in text
    pol.close()


NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None, reason="no nvcc: the CUDA kernel cannot be built here")
def test_a_cuda_optimize_prompt_shows_ptxas_registers_shared_memory_and_spills(spec, tmp_path):
    """A real nvcc build (it compiles without a GPU): the optimize prompt of a CUDA policy quotes ptxas's
    registers, shared memory, barriers, stack frame and spills, and a repair prompt gets none of them."""
    cand = Candidate("cuda", (Path(__file__).parent / "llm" / "rowsum.cu").read_text())
    built = build(cand, "sm_90", cache_dir=tmp_path)
    assert built.ok, built.log
    report = compiler_report(built.log)
    assert re.search(r"Used \d+ registers, used 1 barriers, 1024 bytes smem", report), report
    assert re.search(r"\d+ bytes stack frame, \d+ bytes spill stores, \d+ bytes spill loads", report), report
    assert "Compiling entry function" in report and "$ " not in report  # not the command line
    pol = _policy("cuda")
    parent = _parent(pol, spec, cand, EvalResult(Status.OK, build_log=built.log, timing=_timed(8.0),
                                                 baseline=_timed(20.0), floor_us=4.0))
    text = pol._prompt(spec, "optimize", parent, 0, pol._nodes[pol.propose(spec, parent.idea)[0].id]).text
    _task_elements(text, spec, device="GPU:")
    assert "```cuda" in text and "__shared__ float part" in text
    for line in report.splitlines():
        assert line in text  # registers, shared memory and spills of the kernel, as ptxas gave them
    assert "bytes smem" not in without_report(built.log) and "spill stores" not in without_report(built.log)
    pol.close()


def test_gpu_facts_state_the_h200_as_torch_reports_it():
    """torch's properties of an H200 (as one reported them: 132 SMs, 60 MiB of L2, 227 KiB of opt-in shared
    memory per block): every fact a kernel writer needs, in numbers that are right."""
    h200 = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, clock_rate=1980000,
                                 L2_cache_size=62914560, shared_memory_per_block_optin=232448,
                                 shared_memory_per_multiprocessor=233472, regs_per_multiprocessor=65536, warp_size=32,
                                 max_threads_per_block=1024, max_threads_per_multi_processor=2048,
                                 total_memory=150754820096, memory_clock_rate=3201000, memory_bus_width=6144)
    text = gpu_facts(h200)
    for fact in ("NVIDIA H200 (sm_90)", "132 SMs at up to 1.98 GHz", "L2 60 MiB", "up to 227 KiB per block",
                 "228 KiB of shared memory per SM", "65536 32-bit registers per SM", "warps of 32 threads",
                 "1024 threads per block and 2048 per SM", "140 GiB memory at a peak of 4.9 TB/s"):
        assert fact in text, (fact, text)
    old = types.SimpleNamespace(**{k: v for k, v in vars(h200).items() if k not in ("memory_clock_rate", "clock_rate")})
    assert "TB/s" not in gpu_facts(old) and "GHz" not in gpu_facts(old)  # what torch does not report is left out


@pytest.mark.cuda
def test_cuda_facts_are_the_devices_own():
    props = torch.cuda.get_device_properties("cuda")
    text = cuda_facts("cuda")
    assert props.name in text and f"sm_{props.major}{props.minor}" in text
    assert f"{props.multi_processor_count} SMs" in text and f"{props.regs_per_multiprocessor} 32-bit" in text


def test_repair_build_prompt_has_the_errors_without_the_vectoriser_noise(spec, tmp_path):
    pol = _policy()
    cand = Candidate("cpu", KERNELS["broken"])
    built = build(cand, cache_dir=tmp_path)
    assert not built.ok
    parent = _parent(pol, spec, cand, EvalResult(Status.BUILD_ERROR, "error", build_log=built.log))
    idea = pol.propose(spec, parent.idea)[0]
    assert idea.kind == "repair-build"
    text = pol._prompt(spec, "repair-build", parent, 0, pol._nodes[idea.id]).text
    _task_elements(text, spec)
    assert "by the compiler" in text and "error:" in text and "/tmp" not in text
    assert "missed:" not in without_report(built.log)
    pol.close()


def test_repair_wrong_prompt_shows_where_the_output_is_wrong(spec, tmp_path):
    """A kernel that leaves the tail wrong, judged by the real verifier: the prompt names the tail and the worst
    elements (index, expected, got)."""
    prof, _ = profile_model(load_file(MODELS / "sincos_erf.py"), budget_s=0.05)
    sincos = TaskSpec.of(prof.tasks[0])
    cand = Candidate("cpu", KERNELS["tail"])
    with Evaluator("cpu", seed=0, cache_dir=tmp_path) as ev:
        res = ev.evaluate(sincos, cand)
    assert res.status is Status.WRONG_RESULT, res.message
    found = Mismatch.from_dict(res.verify["mismatch"])
    assert found.pattern.startswith("tail only") and found.worst and found.wrong < found.total
    pol = _policy()
    parent = _parent(pol, sincos, cand, res)
    idea = pol.propose(sincos, parent.idea)[0]
    assert idea.kind == "repair-wrong" and pol.repairable(sincos, parent.idea, res)
    text = pol._prompt(sincos, "repair-wrong", parent, 0, pol._nodes[idea.id]).text
    assert "**wrong_result**" in text and "tail only" in text and "expected" in text and ", got " in text
    assert sincos.source.strip().splitlines()[-1].strip() in text and "## Lineage" in text
    _task_elements(text, sincos)  # and the whole task: tensors, eager time, share, floor, device
    # a wrong result is never timed: the task's eager time and floor are what the search measured on other nodes
    pol.told(sincos, Feedback(eager_us=120.0, floor_us=15.0, tried=2))
    text = pol._prompt(sincos, "repair-wrong", parent, 0, pol._nodes[idea.id]).text
    assert "eager PyTorch: 120.00 us" in text and "roofline floor: 15.00 us" in text
    pol.close()


def test_repair_format_prompt_names_the_reason():
    text = render_prompt("repair-format", reason="the answer is truncated: it ends inside a code block", backend="cpu",
                  lang="cpp").text
    assert "truncated" in text and "```cpp" in text and "system prompt" in text


def test_every_kind_has_a_template():
    assert {p.name.removesuffix(".md.j2") for p in (PROMPTS / "llm").glob("*.md.j2")} >= {*KINDS, "system"}


def test_the_last_complete_block_of_the_right_language_is_taken():
    good, broken = KERNELS["good"], KERNELS["broken"]
    drafts = f"A first draft:\n```cpp\n{broken}```\nOn reflection, the final version:\n```cpp\n{good}```\n"
    assert extract_code(drafts, "cpu").strip() == good.strip()
    longer = broken + "// " + "x" * 2000 + "\n"  # the longest block no longer wins
    assert extract_code(f"```cpp\n{longer}```\n```cpp\n{good}```", "cpu").strip() == good.strip()
    with pytest.raises(Malformed, match="```rust block, but the cpu backend takes ```cpp"):
        parse_answer("```rust\npub extern \"C\" fn forge_launch() -> i32 { 0 }\n```", "cpu")
    with pytest.raises(Malformed, match="truncated"):
        parse_answer(f"Here:\n```cpp\n{good[:200]}", "cpu")
    cut_after_draft = f"```cpp\n{good}```\nand faster:\n```cpp\n{broken[:100]}"  # a complete block still wins
    assert extract_code(cut_after_draft, "cpu").strip() == good.strip()


def test_mismatch_patterns():
    r = torch.randn(8, 16)
    every = torch.ones(8, 16, dtype=torch.bool)
    o = r.clone()
    o[:, 13:] = 0
    assert mismatch(0, o, r, every, 1e-5).pattern.startswith("tail of every row: the last 3 of 16")
    o = r.clone()
    o[5] += 1
    assert mismatch(0, o, r, every, 1e-5).pattern.startswith("one row: row 5")
    o = r.clone()
    o.view(-1)[100:] = float("nan")
    m = mismatch(0, o, r, every, 1e-5)
    assert m.pattern.startswith("tail only") and m.nonfinite == 28 and "NaN" in m.pattern
    assert mismatch(0, r * 2, r, every, 1e-5).pattern.startswith("all wrong")
    o = r.clone()
    o[1, 3], o[6, 1] = 5.0, 7.0
    m = mismatch(0, o, r, every, 1e-5)
    assert m.pattern.startswith("some rows: 2 of 8") and {w[0] for w in m.worst} == {(1, 3), (6, 1)}
    assert Mismatch.from_dict(m.as_dict()) == m


def test_cpu_facts_name_threads_shared_caches_and_avx512_features():
    text = cpu_facts()
    assert "OpenMP runs" in text and "threads in the worker" in text
    flags = Path("/proc/cpuinfo").read_text()
    if " avx512bw" in flags:
        assert "avx512bw" in text
    if Path("/sys/devices/system/cpu/cpu0/cache/index3").exists():
        assert "L3" in text and "per core" not in text.split("L3", 1)[1].split(",")[0] or "shared by" in text


def test_ideas_cost_nothing_until_chosen(spec):
    pol = _policy()
    ideas = pol.propose(spec, None)
    assert all(isinstance(i, Idea) for i in ideas)
    assert all(pol._nodes[i.id].request is not None for i in ideas)  # built, not sent
    pol.close()


def test_a_scan_tasks_prompt_shows_the_librarys_loop_and_the_inputs_domains():
    """A scan (forge.capture.scans) is one op in its source: the prompt shows the library function it runs, the loop
    the kernel replaces, and the domain verification draws the decay and the rates in."""
    lib = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from forge.capture.export import capture
    from forge.tasks.cut import build_tasks

    class Rule(torch.nn.Module):
        def forward(self, q, k, v, g, beta):
            return lib.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]

    q, k, v = (torch.randn(1, 80, 2, 16) for _ in range(3))
    tasks = build_tasks(capture(Rule(), [q, k, v, -torch.rand(1, 80, 2), torch.rand(1, 80, 2)]).graph_module.graph)
    spec = TaskSpec.of(next(t for t in tasks if t.family == "scan"))
    pol = _policy()
    idea = pol.propose(spec, None)[0]
    text = pol._prompt(spec, "first", None, 0, pol._nodes[idea.id]).text
    assert "a loop of the model's library (a scan over chunks)" in text and "torch.ops.forge_scan." in text
    assert "def torch_chunk_gated_delta_rule(" in text and "for i in range(num_chunks):" in text
    assert "whose forward is" not in text and spec.module in text
    assert "`in[3]`: float32, shape [1, 80, 2], strides [160, 2, 1], random <= 0 (a log decay)" in text
    assert "`in[4]`: float32, shape [1, 80, 2], strides [160, 2, 1], random in [0, 1] (a rate)" in text
    assert "`in[0]`: float32, shape [1, 80, 2, 16], strides [2560, 32, 16, 1], random" in text
    pol.close()
