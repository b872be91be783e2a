"""Loading model files: the KernelBench convention and every bad-input error (exit 2, one line)."""

import subprocess
import sys

import pytest
import torch
from conftest import EXAMPLES, MODELS

from forge.capture.model_input import load_file
from forge.cli import main
from forge.errors import UserError


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("does_not_exist.py", "model file not found"),
        ("raises_on_import.py", "raised on import (line 2): RuntimeError: boom at import"),
        ("no_model.py", "defines no `Model` class"),
        ("no_get_inputs.py", "defines no get_inputs()"),
        ("non_tensor_inputs.py", "returned a str, not a tensor"),
        ("model_not_module.py", "must be a subclass of torch.nn.Module"),
    ],
)
def test_bad_model_files_exit_2_with_one_line(capsys, file, expected):
    code, err = run_cli(capsys, "profile", str(MODELS / file))
    assert code == 2
    assert expected in err
    assert len(err.splitlines()) == 1 and err.startswith("forge: error: ")


def test_a_branch_on_a_tensors_value_says_what_to_do(capsys):
    """torch.export refuses it; forge's one line says why and the way out (the partial graph torch prints on its
    own goes to forge's debug log, not to the user)."""
    code, err = run_cli(capsys, "profile", str(MODELS / "branches_on_a_value.py"))
    assert code == 2
    assert len(err.splitlines()) == 1, err
    last = err.splitlines()[-1]
    assert last.startswith("forge: error: could not capture the model with torch.export: GuardOnDataDependent")
    assert last.endswith("a Python branch on a tensor's value is not one (torch.cond, or the branch outside Model)")


def test_dtype_the_model_cannot_take(capsys):
    code, err = run_cli(capsys, "profile", str(MODELS / "fp32_only.py"), "--dtype", "bf16")
    assert code == 2
    assert "does not run in bf16 on cpu" in err and "try --dtype fp32" in err


def test_unknown_dtype_and_device(capsys):
    assert run_cli(capsys, "profile", str(EXAMPLES / "rmsnorm_swiglu.py"), "--dtype", "fp8")[1].endswith(
        "unknown dtype 'fp8': use one of fp32, bf16, fp16")
    code, err = run_cli(capsys, "profile", str(EXAMPLES / "rmsnorm_swiglu.py"), "--device", "tpu")
    assert code == 2 and "unknown device 'tpu'" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when no GPU is present")
def test_cuda_asked_for_and_absent(capsys):
    code, err = run_cli(capsys, "profile", str(EXAMPLES / "rmsnorm_swiglu.py"), "--device", "cuda")
    assert code == 2 and "no CUDA GPU is available here" in err and "--device cpu" in err


def test_no_model_and_zoo_only_options(capsys):
    assert run_cli(capsys, "profile")[1].endswith("no model given: pass a model file "
                                                  "(e.g. examples/rmsnorm_swiglu.py) or --zoo NAME")
    code, err = run_cli(capsys, "profile", str(EXAMPLES / "rmsnorm_swiglu.py"), "--layers", "2")
    assert code == 2 and "--layers applies to --zoo models only" in err


def test_console_script_exit_code():
    """The installed entry point, in a real process: exit code 2 and one line on stderr."""
    proc = subprocess.run([sys.executable, "-m", "forge.cli", "profile", str(MODELS / "no_model.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]


def test_load_file_casts_model_and_float_inputs():
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py", "cpu", "bf16")
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.inputs[0].dtype == torch.bfloat16
    assert loaded.model.training and loaded.mode == "train"  # as constructed (nn.Module's default), as KernelBench


def test_load_file_keeps_the_mode_and_the_buffers_unless_eval_is_asked():
    """A file's model in the mode it was built in; its one check run leaves BatchNorm's running stats as built."""
    loaded = load_file(MODELS / "conv_batchnorm.py")
    bn = loaded.model.bn
    assert loaded.mode == "train" and int(bn.num_batches_tracked) == 0
    assert torch.equal(bn.running_mean, torch.zeros(8)) and torch.equal(bn.running_var, torch.ones(8))
    assert load_file(MODELS / "conv_batchnorm.py", eval=True).mode == "eval"


def test_a_zoo_model_is_in_eval_mode():
    from forge.capture.model_input import load_zoo

    assert load_zoo("resnet50", "meta").mode == "eval"


def test_load_file_on_meta_allocates_nothing():
    loaded = load_file(EXAMPLES / "groupnorm_silu_conv.py", "meta")
    assert all(p.is_meta for p in loaded.model.parameters())
    assert loaded.inputs[0].is_meta and loaded.inputs[0].shape == (4, 64, 64, 64)


def test_user_error_is_an_exception_with_the_message():
    with pytest.raises(UserError, match="model file not found"):
        load_file("nowhere/model.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the redirect when no GPU is present")
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_files_that_hard_code_cuda_load_on_cpu_and_meta(device):
    loaded = load_file(MODELS / "cuda_inputs_in_file.py", device)
    assert all(x.device.type == device for x in loaded.inputs)


def test_meta_build_of_inputs_from_distributions(tmp_path):
    f = tmp_path / "dist.py"
    f.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n\n"
                 "def get_inputs():\n    d = torch.distributions.Pareto(torch.tensor(1.0), torch.tensor(2.0))\n"
                 "    return [d.sample((4, 8))]\n\ndef get_init_inputs():\n    return []\n")
    before = torch.distributions.Distribution._validate_args  # torch.compile elsewhere in a session turns it off
    torch.distributions.Distribution.set_default_validate_args(True)
    try:
        assert load_file(f, "meta").inputs[0].shape == (4, 8)
        assert torch.distributions.Distribution._validate_args  # restored after the build
    finally:
        torch.distributions.Distribution.set_default_validate_args(before)


def test_what_export_prints_is_held_back_from_this_thread_only(capsys):
    """The capture holds back what torch.export prints (this thread's stderr); another thread's writes (a live
    progress display) go through as they are made."""
    import io
    import sys
    import threading

    from forge.capture.export import _this_thread_stderr

    held = io.StringIO()
    with _this_thread_stderr(held):
        print("partial graph", file=sys.stderr)
        t = threading.Thread(target=lambda: print("progress", file=sys.stderr))
        t.start()
        t.join()
        assert capsys.readouterr().err == "progress\n"
    assert held.getvalue() == "partial graph\n"
    print("after", file=sys.stderr)
    assert capsys.readouterr().err == "after\n"


def test_captures_that_overlap_leave_stderr_passing_through(capsys):
    """Two captures in two threads, the first ending while the second still holds stderr: once both are over,
    this thread's writes reach stderr (the first's wrapper, put back by the second, passes them through), and a
    wrapper answers as the stream it wraps does."""
    import io
    import sys
    import threading

    from forge.capture.export import _this_thread_stderr

    before = sys.stderr
    second_in, first_out = threading.Event(), threading.Event()

    def second() -> None:
        with _this_thread_stderr(io.StringIO()):
            assert sys.stderr.encoding == before.encoding
            second_in.set()
            first_out.wait()

    with _this_thread_stderr(io.StringIO()):
        t = threading.Thread(target=second)
        t.start()
        second_in.wait()
    first_out.set()
    t.join()
    print("reaches stderr", file=sys.stderr)
    assert capsys.readouterr().err == "reaches stderr\n"
    sys.stderr = before
