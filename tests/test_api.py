"""The Python API of the main job: forge.optimize on a model in hand returns the model you get and its report."""

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
    model.train()  # eval=True (the default) puts it in inference mode, as forge optimize does
    fast, report = forge.optimize(model, [x], seconds=40, budget=8, db=tmp_path / "forge.db",
                                  runs_dir=tmp_path / "runs")
    assert not model.training and report.outputs_match
    assert (fast is model) == (not report.applied)  # eager kept: the model itself, else forge's result
    assert (tmp_path / "runs" / report.run_id / "manifest.json").is_file()
    run = Store(tmp_path / "forge.db").get_run(report.run_id)
    assert run.model == "Gate" and run.device == "cpu" and run.dtype == "fp32"
    y = torch.randn(3, 41, 97)
    with torch.no_grad():
        torch.testing.assert_close(fast(y), model(y), rtol=1e-4, atol=1e-4)
