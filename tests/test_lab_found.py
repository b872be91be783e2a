"""forge lab's kernels found by the user's runs (forge.lab.found), read from a real store (conftest's `rs`: a real
`optimize` of examples/rmsnorm_swiglu.py on the CPU): each gets a page in its family where it runs live in the
sandboxed worker, its task's source the reference, with the link to its search tree kept."""

import base64
import dataclasses

import pytest
import torch

from forge.capture.export import capture
from forge.lab.catalogue import TITLES, entry
from forge.lab.found import Found, found_kernels, make_inputs, task_spec
from forge.lab.inputs import make
from forge.lab.lower import lower
from forge.lab.service import Lab, default_settings
from forge.tasks.cut import build_tasks, compile_source

UI = "http://127.0.0.1:9999"


def _client(lab: Lab, found: list[Found]):  # noqa: ANN202 (fastapi's TestClient: an optional extra)
    """The lab's web app under fastapi's test client; skips where fastapi (the `dev` extra) is absent (the device
    machine's image)."""
    testclient = pytest.importorskip("fastapi.testclient", reason="forge lab needs fastapi ('.[dev]')")
    from forge.lab.web import create_app

    return testclient.TestClient(create_app(lab, found))


@pytest.fixture(scope="module")
def found(rs):
    from forge.store import Store

    store = Store(rs.db)
    try:
        kernels = found_kernels(store, UI)
    finally:
        store.close()
    assert kernels, "the real search found no kernel that passed"
    return kernels


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab("cpu", tmp_path_factory.mktemp("labfound"))
    yield lab
    lab.close()


def test_a_tasks_metadata_reads_back_from_its_source():
    """task_spec gives the spec forge.tasks.cut rendered: shapes, dtypes, strides (a transposed input's too)."""
    for slug in ("gelu", "layer-norm-rows", "to-bfloat16", "greater", "transpose"):
        e = entry(slug)
        s = default_settings(e)
        spec = lower(e.fn, make(e.inputs, s), s.param, "cpu", ideas=1).spec
        back = task_spec(spec.key, spec.source)
        assert (back.inputs, back.outputs, back.floor_bytes) == (spec.inputs, spec.outputs, spec.floor_bytes), slug

    class Scaled(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    (task,) = build_tasks(capture(Scaled(), [torch.randn(6, 4).t()]).graph_module.graph)
    back = task_spec(task.key, task.source)
    assert back.inputs == task.inputs and back.inputs[0].stride == (1, 4) and back.outputs == task.outputs
    with pytest.raises(ValueError, match="no tensor metadata"):
        task_spec("x", "def region(in0):\n    return (in0,)\n")


def test_found_kernels_come_from_the_store_with_their_task_and_kernel(found, rs):
    for k in found:
        assert k.run_id == rs.run_id and k.family in TITLES and k.backend == "cpu" and k.device == "cpu"
        assert "forge_launch" in k.kernel and k.source.startswith("import operator")
        assert k.tree_url == f"{UI}/runs/{rs.run_id}/tasks/{k.task_id}"
        spec = k.spec()
        assert spec.key == k.task and spec.inputs and spec.outputs
        ins = make_inputs(spec, -1.0, 1.0)
        assert [tuple(x.shape) for x in ins] == [m.shape for m in spec.inputs]
        assert all(float(x.min()) >= -1 and float(x.max()) <= 1 for x in ins if x.is_floating_point())


def test_a_found_kernel_runs_live_in_the_worker(found, lab):
    k = found[0]
    out = lab.run_found(k, -2.0, 2.0)
    assert out.path == "forge" and out.status == "ok", out.why
    assert out.kernel_source == k.kernel and out.task_source == k.source and out.tried == 1
    assert out.us > 0 and out.eager_us > 0 and out.max_error is not None and out.max_error < 1e-3
    spec = k.spec()
    want = compile_source(k.source)(*make_inputs(spec, -2.0, 2.0))
    for got, ref in zip(out.outputs, want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    verdicts = len(list(lab.cache.root.glob("verdicts/*.json")))
    assert lab.run_found(k, -1.0, 1.0).status == "ok"  # judged once: its verdict is cached by content
    assert len(list(lab.cache.root.glob("verdicts/*.json"))) == verdicts


def test_each_found_kernel_has_a_page_in_its_family_that_runs_it(found, lab):
    client = _client(lab, found)
    index = client.get("/").text
    for k in found:
        section = index.split(f'data-family="{k.family}"', 1)[1].split("</section>", 1)[0]
        assert f'href="/found/{k.slug}"' in section
    k = found[0]
    page = client.get(f"/found/{k.slug}")
    assert page.status_code == 200 and f'href="{k.tree_url}"' in page.text
    assert f'data-api="/api/found/{k.slug}"' in page.text
    r = client.post(f"/api/found/{k.slug}", json={"lo": -1, "hi": 1})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["path"] == "forge" and d["us"] > 0 and d["eager_us"] > 0 and d["speedup"] > 0
    assert d["max_error"] < 1e-3 and d["shapes"] == [list(m.shape) for m in k.spec().outputs]
    assert d["pictures"] and all(base64.b64decode(p["uri"].split(",", 1)[1]) for p in d["pictures"])
    bad = client.post(f"/api/found/{k.slug}", json={"lo": 2, "hi": 1})
    assert bad.status_code == 400 and "Invalid range" in bad.json()["error"]
    assert client.post("/api/found/no-such-run-1", json={}).status_code == 404
    assert client.get("/found/no-such-run-1").status_code == 404


def test_a_kernel_for_another_device_has_a_page_but_does_not_run(found, lab):
    gpu: Found = dataclasses.replace(found[0], backend="cuda", task_id=10**6)
    client = _client(lab, [gpu])
    page = client.get(f"/found/{gpu.slug}")
    assert page.status_code == 200 and "cannot run here" in page.text and "run-form" not in page.text
    r = client.post(f"/api/found/{gpu.slug}", json={})
    assert r.status_code == 400 and "this lab runs on cpu" in r.json()["error"]
