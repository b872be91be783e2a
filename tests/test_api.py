"""The Python API of the main job: forge.optimize on a model in hand returns the model you get and its report."""

import copy

import torch

import forge
from forge.store import Store


class Gate(torch.nn.Module):
    """An RMSNorm, a projection and a SwiGLU-like gate: odd sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(97) + 0.5)
        self.proj = torch.nn.Linear(97, 130)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        a, b = self.proj(h).chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b


def test_optimize_returns_the_model_you_get_and_stores_the_run(tmp_path):
    torch.manual_seed(0)
    model, x = Gate(), torch.randn(3, 41, 97)
    model.train()  # eval=True puts it in inference mode, as forge optimize --eval does
    fast, report = forge.optimize(model, [x], seconds=40, budget=8, db=tmp_path / "forge.db",
                                  runs_dir=tmp_path / "runs", eval=True)
    assert not model.training and report.outputs_match and report.mode == "eval"
    assert (fast is model) == (not report.applied)  # eager kept: the model itself, else forge's result
    assert (tmp_path / "runs" / report.run_id / "manifest.json").is_file()
    run = Store(tmp_path / "forge.db").get_run(report.run_id)
    assert run.model == "Gate" and run.device == "cpu" and run.dtype == "fp32"
    y = torch.randn(3, 41, 97)
    with torch.no_grad():
        torch.testing.assert_close(fast(y), model(y), rtol=1e-4, atol=1e-4)


def test_optimize_takes_the_model_as_given_by_default(tmp_path):
    """eval=False: a BatchNorm model in training mode is optimized as that function; its buffers left as given."""
    from conftest import MODELS

    from forge.capture.model_input import load_file

    loaded = load_file(MODELS / "conv_batchnorm.py")
    model, twin = loaded.model, copy.deepcopy(loaded.model)
    fast, report = forge.optimize(model, loaded.inputs, seconds=15, budget=4, db=tmp_path / "forge.db",
                                  runs_dir=tmp_path / "runs")
    assert model.training and report.mode == "train" and report.to_json()["mode"] == "train"
    assert report.outputs_match and int(model.bn.num_batches_tracked) == 0  # forge's own calls undone
    assert Store(tmp_path / "forge.db").get_run(report.run_id).config["mode"] == "train"
    x = torch.randn_like(loaded.inputs[0])
    with torch.no_grad():
        torch.testing.assert_close(fast(x), twin(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.bn.running_var, twin.bn.running_var)
