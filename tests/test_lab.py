"""forge lab: settings validated, pictures drawn, kernels lowered, judged in the real worker, run live on a
person's inputs and cached; the app answers bad input with a message and goes on."""

import base64
import io
import re

import pytest
import torch

from forge.evaluate.evaluator import Evaluator
from forge.lab.catalogue import TITLES, catalogue, entry
from forge.lab.inputs import MAKERS, parse_settings, read_image
from forge.lab.lower import lower
from forge.lab.pictures import draw
from forge.lab.service import Lab, default_settings
from forge.lab.testimage import test_image as lab_image
from forge.policy.recipes.policy import RecipePolicy
from forge.tasks.cut import compile_source


def test_catalogue_has_every_family_and_over_100_entries():
    entries = catalogue()
    assert len(entries) >= 100
    assert {e.family for e in entries.values()} == set(TITLES)
    assert len({e.slug for e in entries.values()}) == len(entries)


@pytest.mark.parametrize("raw, message", [
    ({"n": 10**9}, "Invalid size 'n'"), ({"n": "ten"}, "not a number"), ({"n": 2.5}, "whole number"),
    ({"lo": 3, "hi": 1}, "Invalid range"), ({"hi": "inf"}, "not finite"),
])
def test_bad_settings_get_a_clear_message(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_settings(MAKERS["curve"], raw, None, (-1.0, 1.0))


def test_sizes_are_capped_by_elements_too():
    with pytest.raises(ValueError, match="elements in one input"):
        parse_settings(MAKERS["rows"], {"rows": 4096, "cols": 4096}, None, (0, 1))
    with pytest.raises(ValueError, match="Invalid parameter"):
        parse_settings(MAKERS["curve"], {"param": 99}, (0.1, 0.0, 1.0), (0, 1))


def test_an_image_is_read_and_a_non_image_refused():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (20, 10), (255, 0, 0)).save(buf, "PNG")
    img = read_image(buf.getvalue())
    assert img.shape == (1, 3, 10, 20) and float(img[0, 0].min()) == 1.0 and float(img[0, 1].max()) == 0.0
    with pytest.raises(ValueError, match="Invalid image"):
        read_image(b"GIF89a but not really")
    t = lab_image()
    assert t.shape == (1, 3, 256, 256) and 0.2 < float(t.mean()) < 0.8 and float(t.std()) > 0.1


@pytest.mark.parametrize("kind", ["curve", "series", "histogram", "spectrum", "mask", "image", "heatmap"])
def test_pictures_decode(kind):
    from PIL import Image

    x = torch.linspace(-1, 1, 64)
    inputs = {"image": (torch.rand(1, 3, 16, 16),), "mask": (torch.rand(16, 16),),
              "heatmap": (torch.randn(8, 4), torch.randn(4, 6))}.get(kind, (x,))
    out = (torch.rand(16, 16) > 0.5,) if kind == "mask" else (torch.tanh(inputs[0]),)
    pics = draw(kind, inputs, out, out, default_settings(entry("gelu")), "forge")
    assert pics
    for p in pics:
        head, data = p.uri.split(",", 1)
        raw = base64.b64decode(data)
        if head.startswith("data:image/svg+xml"):
            assert raw.startswith(b"<svg") and b"</svg>" in raw
            if kind in ("curve", "series", "spectrum"):
                assert re.search(rb'<polyline points="[0-9.]+,[0-9.]+ ', raw)
        else:
            assert Image.open(io.BytesIO(raw)).size[0] >= 16


def test_lowering_finds_a_recipe_kernel_or_says_why():
    pol = RecipePolicy("cpu")
    for slug, forge in (("gelu", True), ("layer-norm-rows", True), ("matmul", False), ("rfft", False)):
        e = entry(slug)
        s = default_settings(e)
        from forge.lab.inputs import make

        low = lower(e.fn, make(e.inputs, s), s.param, pol)
        assert low.forge is forge, (slug, low.why)
        assert bool(low.why) is not forge
        if forge:
            assert "forge_launch" in low.candidate.source and low.spec.source.startswith("import operator")


def test_evaluator_call_runs_a_kernel_on_given_inputs_in_the_worker():
    e = entry("silu")
    x = torch.linspace(-3, 3, 777)
    low = lower(e.fn, [x], 0.0, RecipePolicy("cpu"))
    with Evaluator("cpu", timeout_s=60) as ev:
        out = ev.call(low.spec, low.candidate, [x])
        assert isinstance(out, tuple), out
        torch.testing.assert_close(out[0], torch.nn.functional.silu(x))
        with pytest.raises(ValueError, match="Invalid input 0"):
            ev.call(low.spec, low.candidate, [x[:10]])
        assert ev.worker.proc is not None and ev.worker.proc.pid  # it ran in the worker process


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab("cpu", tmp_path_factory.mktemp("labcache"))
    yield lab
    lab.close()


def test_a_forge_kernel_is_judged_cached_and_run_live(lab):
    e = entry("leaky-relu")
    s = parse_settings(e.inputs, {"n": 300, "param": 0.25, "lo": -2, "hi": 2}, e.param_bounds, (e.lo, e.hi))
    out = lab.run(e, s)
    assert out.path == "forge" and out.status == "ok", out.why
    want = torch.nn.functional.leaky_relu(torch.linspace(-2, 2, 300), 0.25)
    torch.testing.assert_close(out.outputs[0], want)
    torch.testing.assert_close(out.eager[0], want)
    assert out.max_error is not None and out.max_error < 1e-5 and out.us > 0 and out.eager_us > 0
    assert "forge_launch" in out.kernel_source
    assert len(list(lab.cache.root.glob("verdicts/*.json"))) == 1
    state = lab.build(e)  # the default settings: another parameter, another task, another verdict
    assert state.path == "forge" and state.status == "ok" and state.task.startswith("leaky_relu")
    before = len(list(lab.cache.root.glob("verdicts/*.json")))
    again = lab.build(e)  # cached: nothing judged again
    assert again == state and len(list(lab.cache.root.glob("verdicts/*.json"))) == before == 2


def test_vendor_path_is_marked_and_checked_against_float64(lab):
    e = entry("cumsum")
    out = lab.run(e, default_settings(e))
    assert out.path == "vendor" and out.why and out.us is None and out.eager_us > 0
    assert out.max_error is not None and out.max_error < 1e-3
    assert lab.build(e).path == "vendor"


def test_app_answers_bad_input_and_goes_on(lab):
    from fastapi.testclient import TestClient

    from forge.lab.web import create_app

    client = TestClient(create_app(lab))
    page = client.get("/")
    assert page.status_code == 200 and page.text.count('class="card"') == len(catalogue())
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for body, message in (({"size": 100000}, "Invalid size"), ({"image": "data:image/png;base64,aGVsbG8="},
                                                                "Invalid image"),
                          ({"image": "%%%"}, "not valid base64"), ("[1, 2]", "not a JSON object")):
        r = client.post("/api/run/group-norm-3", content=body if isinstance(body, str) else None,
                        json=None if isinstance(body, str) else body)
        assert r.status_code == 400 and message in r.json()["error"], r.text
    assert client.post("/api/run/no-such-kernel", json={}).status_code == 404
    ok = client.post("/api/run/transpose", json={"size": 24})
    assert ok.status_code == 200, ok.text
    d = ok.json()
    assert d["path"] == "forge" and d["max_error"] == 0.0 and len(d["pictures"]) == 2
    assert d["shapes"] == [[1, 3, 24, 24]]
    assert client.get("/kernels/transpose").status_code == 200


def test_eager_reference_of_a_lowered_task_matches_the_function():
    e = entry("residual-rmsnorm")
    from forge.lab.inputs import make

    s = default_settings(e)
    ins = make(e.inputs, s)
    low = lower(e.fn, ins, s.param, RecipePolicy("cpu"))
    got = compile_source(low.spec.source)(*[ins[i] for i in low.order])[0]
    torch.testing.assert_close(got, e.fn(*ins))
