"""What forge hands a user (forge.runtime.result.ForgeModel): forge's result only where it computes what the
model would; gradients, replaced and changed parameters, other shapes run the model itself, counted."""

import logging

import torch

from forge.runtime.variants import Variant, build


class Net(torch.nn.Module):
    """A convolution, an eval-mode BatchNorm (what fold-bn folds) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)
        self.register_buffer("scale", torch.full((5,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return self.head(h.mean((2, 3))) * self.scale


def _net() -> tuple[Net, torch.Tensor]:
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():  # a BatchNorm with statistics of its own, so that folding it changes the weights
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
        model.bn.weight.uniform_(0.5, 1.5)
    return model, torch.randn(2, 3, 12, 12)


def _result(model: Net, x: torch.Tensor, rewrites: tuple[str, ...] = ()):
    fn, _, _ = build(model, [x], [], Variant(False, rewrites, "graph"), "cpu")
    return fn


def _same(result, model: Net, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(result(x), model(x))


def test_a_gradient_needed_runs_the_model_itself_and_backward_works(caplog):
    model, x = _net()
    result = _result(model, x)
    _same(result, model, x)
    with caplog.at_level(logging.WARNING):
        y = result(x)  # grad mode on, parameters require grad
        result(x)
    y.sum().backward()
    assert model.conv.weight.grad is not None and model.conv.weight.grad.abs().sum() > 0
    assert caplog.text.count("gradients enabled") == 1  # said once, counted every time
    x_grad = x.clone().requires_grad_()
    model.requires_grad_(False)
    result(x_grad).sum().backward()  # an input that requires grad: eager too
    assert x_grad.grad is not None
    with torch.no_grad():
        result(x)
    whole = result.counters()["model"]
    assert whole.hits == 2 and whole.fallbacks == {"gradient needed": 3}


def test_a_replaced_parameter_is_read_by_the_graph():
    model, x = _net()
    result = _result(model, x)
    _same(result, model, x)
    model.head.weight = torch.nn.Parameter(torch.randn(5, 8))  # same shape: the graph takes it
    model.head = torch.nn.Linear(8, 5)  # a new submodule, its parameters too
    model.scale = torch.full((5,), -3.0)  # a buffer assigned anew
    _same(result, model, x)
    assert result.counters()["model"].hits == 2 and not result.counters()["model"].fallbacks
    with torch.no_grad():  # changed in place: read as it is (the graph holds the tensors themselves)
        model.conv.weight.mul_(0.5)
    _same(result, model, x)
    assert result.counters()["model"].hits == 3


def test_a_parameter_the_graph_cannot_take_runs_the_model_from_then_on(caplog):
    model, x = _net()
    result = _result(model, x)
    model.head.weight = torch.nn.Parameter(torch.randn(8, 5).t())  # other strides than the captured ones
    with caplog.at_level(logging.WARNING):
        _same(result, model, x)
        _same(result, model, x)
    assert "was replaced after forge built its result" in caplog.text
    assert result.counters()["model"].fallbacks == {"parameters replaced": 2}


def test_a_change_in_place_under_folded_weights_runs_the_model_from_then_on(caplog):
    model, x = _net()
    result = _result(model, x, ("fold-bn",))
    _same(result, model, x)
    state = {k: v + 0.1 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)  # in place: the folded weights are stale
    with caplog.at_level(logging.WARNING):
        _same(result, model, x)
    assert "changed in place" in caplog.text
    whole = result.counters()["model"]
    assert whole.hits == 1 and whole.fallbacks == {"parameters changed": 1}


def test_other_shapes_are_counted_with_the_model():
    model, x = _net()
    result = _result(model, x)
    _same(result, model, x)
    _same(result, model, torch.randn(3, 3, 10, 10))
    whole = result.counters()["model"]
    assert whole.hits == 1 and whole.fallbacks == {"inputs differ": 1}
    assert not list(result.parameters())  # the model is not a submodule of the result: its state is its own
