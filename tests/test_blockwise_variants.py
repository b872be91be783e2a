"""Block-wise variants (forge.runtime.variants_blocks): measured by `forge optimize --blocks`, compiled once a kind,
saved and rebuilt block-wise."""

from collections import Counter

import pytest
import torch
from blockwise_towers import Tower, recipe_kernels

from forge.runtime.dispatch import Counters


@pytest.mark.slow
def test_optimize_block_wise_measures_block_wise_variants_and_loads_its_result(tmp_path, monkeypatch):
    import json

    from conftest import MODELS

    import forge
    from forge.capture.model_input import load_file
    from forge.cli import main
    from forge.runtime.blockwise import BlockwiseModule

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.json"
    code = main(["optimize", str(MODELS / "stacked_rms_blocks.py"), "--blocks", "--no-inductor", "--seconds", "40",
                 "--budget", "16", "--db", str(tmp_path / "f.db"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["outputs_match"] is True
    variants = [m["variant"] for m in report["variants"]]
    assert variants and all(v["blocks"] and v["name"].endswith("block-wise") for v in variants)
    # each ran with every block on its kind's graph and a kernel in it (else the variant fails, with why)
    assert all(m["match"] and not m["error"] for m in report["variants"])
    loaded = load_file(MODELS / "stacked_rms_blocks.py")
    opt = forge.load(tmp_path / report["artifact"], loaded.model, loaded.inputs)
    x = torch.randn(8, 128, 128)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), loaded.model(x), rtol=1e-4, atol=1e-5)
    if report["applied"]:  # the block-wise result, rebuilt (under forge.load's ForgeModel): its kernels ran in all
        # four blocks (a branch a noisy machine often skips: eager is kept where the kernels do not win)
        bw = opt.patched
        assert isinstance(bw, BlockwiseModule) and bw.block_fallbacks == 0
        assert all(c.hits % 4 == 0 and c.hits and not c.fallbacks for c in bw.counters().values())


def test_a_block_wise_artifact_is_rebuilt_block_wise(tmp_path):
    import forge
    from forge.runtime import artifact
    from forge.runtime.blockwise import BlockwiseModule
    from forge.runtime.variants import Variant

    torch.manual_seed(5)
    model, x = Tower().eval(), torch.randn(3, 40, 96)
    arts = recipe_kernels(model, [x])
    variant = Variant(True, (), "graph", blocks=True)
    artifact.save(tmp_path / "a", arts, {"device_model": artifact.device_model("cpu"), "layout": "",
                                          "variant": variant.to_json()})
    opt = forge.load(tmp_path / "a", model, [x])
    assert isinstance(opt.patched, BlockwiseModule)
    y = torch.randn(3, 40, 96)
    with torch.no_grad():
        torch.testing.assert_close(opt(y), model(y))
    counters = opt.counters()
    assert counters.pop("model") == Counters(1, Counter())  # one forward, forge's
    assert counters and all(c.hits == 3 and not c.fallbacks for c in counters.values())
    assert Variant.parse(variant.to_json()) == variant and variant.name == "kernels, graph, block-wise"


def test_without_kernels_or_compilation_nothing_is_measured_and_nothing_applies():
    from forge.runtime.variants_blocks import choose_blockwise

    best, tried = choose_blockwise(Tower(), [torch.randn(2, 96)], [], "cpu", compile=False)
    assert not best.ok and tried == [best] and best.error


@pytest.mark.slow
def test_blocks_compiled_once_a_kind_with_and_without_kernels_match_eager():
    from torch._dynamo.utils import counters

    from forge.runtime.variants import Variant, build

    torch.manual_seed(6)
    model, x = Tower(n=4).eval(), torch.randn(3, 17, 96)
    arts = recipe_kernels(model, [x])
    for variant in (Variant(True, (), "inductor", blocks=True), Variant(False, (), "inductor", blocks=True)):
        torch._dynamo.reset()
        counters.clear()
        fn, opt, sites = build(model, [x], arts, variant, "cpu")
        assert sites == {"blocks": 4, "kinds": 1}
        for _ in range(2):
            y = torch.randn(3, 17, 96)
            with torch.no_grad():
                torch.testing.assert_close(fn(y), model(y))
        # four blocks of one kind: one compilation for all of them, none again on the second forward
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        opt.check_patched(variant.kernels)
        hits = {c.hits for c in opt.counters().values()}
        assert hits == ({8} if variant.kernels else set())  # 2 forwards x 4 blocks, inside the compiled graph
        assert not opt.model_fallbacks and not opt.block_fallbacks
    assert [v.name for v in (Variant(True, (), "inductor", blocks=True), Variant(False, (), "inductor", blocks=True))] \
        == ["kernels, inductor, block-wise", "model, inductor, block-wise"]
    assert not Variant(False, (), "inductor", blocks=True).own_model
    with pytest.raises(ValueError, match="block-wise"):
        Variant(False, (), "graph", blocks=True)


@pytest.mark.slow
def test_past_the_finish_only_the_model_itself_is_compiled():
    import time

    from forge.runtime.variants_blocks import choose_blockwise

    torch.manual_seed(7)
    best, tried = choose_blockwise(Tower().eval(), [torch.randn(2, 96)], [], "cpu", finish=time.monotonic() - 1)
    assert [m.variant.name for m in tried] == ["model, inductor"] and best.ok


def test_the_model_itself_is_compiled_too_only_where_its_compilation_is_expected_to_fit():
    import time

    from forge.runtime.variants import Measured, Variant
    from forge.runtime.variants_blocks import whole_fits

    plain = Variant(False, (), "inductor-cuda-graph", blocks=True)
    ok = Measured(plain, 130.0, 37.0, True, 0.01, 1.0, {"blocks": 24, "kinds": 2})
    failed = Measured(plain, 0.0, 0.0, False, float("inf"), None, {}, "RuntimeError: not capturable")
    now = time.monotonic()
    # 24 blocks whose kinds compiled in 10 s: about 240 s for the whole model
    assert not whole_fits([(ok, 10.0)], now + 200) and whole_fits([(ok, 10.0)], now + 300)
    # judged by the last block-wise compilation that worked (with kernels, where time ran out before the other)
    assert not whole_fits([(ok, 10.0), (failed, 1.0)], now + 200)
    # the floor wherever no block-wise compilation worked, or no time is set
    assert whole_fits([(failed, 30.0)], now + 1) and whole_fits([], now + 1) and whole_fits([(ok, 30.0)], None)
