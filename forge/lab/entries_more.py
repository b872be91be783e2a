"""The lab's entries of the heavier families: attention, quantization, convolution and pooling, matrix
products, shape plumbing, resizing, signal, sequence and the rest (forge.lab.entries has the others)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812

from forge.lab.catalogue import Entry, Param


def _u(f):  # noqa: ANN001, ANN202 - a one-input function without parameter
    return lambda x, p=0.0: f(x)


def _b(f):  # noqa: ANN001, ANN202 - a two-input function without parameter
    return lambda x, y, p=0.0: f(x, y)


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _fake_quant(x: torch.Tensor, scale: float, lo: int, hi: int) -> torch.Tensor:
    return torch.clamp(torch.round(x / scale), lo, hi) * scale


_ATTN = [
    Entry("scaled-masked-softmax", "attention", "softmax(scores * s + causal mask)",
          lambda s, m, p=0.25: torch.softmax(s * p + m, -1), "scores", Param("scale", 0.25, 0.01, 4.0)),
    Entry("scores-softmax", "attention", "softmax of attention scores", lambda s, m, p=0.0: torch.softmax(s, -1),
          "scores"),
    Entry("swiglu-gate", "attention", "SwiGLU gate: silu(a) * b", _b(lambda a, b: F.silu(a) * b), "rows2"),
    Entry("geglu-gate", "attention", "GeGLU gate: gelu(a) * b", _b(lambda a, b: F.gelu(a) * b), "rows2"),
    Entry("residual-rmsnorm", "attention", "residual add then RMSNorm", _b(lambda x, r: _rms(x + r)), "rows2"),
    Entry("residual-layernorm", "attention", "residual add then LayerNorm",
          _b(lambda x, r: F.layer_norm(x + r, x.shape[-1:])), "rows2"),
    Entry("sdpa", "attention", "scaled dot-product attention", lambda q, k, v, p=0.0: F.scaled_dot_product_attention(
        q, k, v), "attention"),
    Entry("sdpa-causal", "attention", "causal scaled dot-product attention",
          lambda q, k, v, p=0.0: F.scaled_dot_product_attention(q, k, v, is_causal=True), "attention"),
    Entry("attention-matmuls", "attention", "attention written as matmuls and a softmax",
          lambda q, k, v, p=0.0: torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v,
          "attention"),
]

_QUANT = [
    Entry("fake-quant-int8", "quantization", "fake-quantize to int8 (scale s)",
          lambda x, p=0.1: _fake_quant(x, p, -128, 127), "curve", Param("scale", 0.1, 0.001, 2.0), lo=-16, hi=16),
    Entry("fake-quant-int4", "quantization", "fake-quantize to int4 (scale s)",
          lambda x, p=0.5: _fake_quant(x, p, -8, 7), "curve", Param("scale", 0.5, 0.01, 2.0)),
    Entry("fake-quant-uint8", "quantization", "fake-quantize to uint8 (scale s)",
          lambda x, p=0.05: _fake_quant(x, p, 0, 255), "curve", Param("scale", 0.05, 0.001, 1.0), lo=-2, hi=16),
    Entry("to-bfloat16", "quantization", "round to bfloat16 and back",
          _u(lambda x: x.to(torch.bfloat16).float()), "curve", lo=250, hi=260),
    Entry("to-float16", "quantization", "round to float16 and back",
          _u(lambda x: x.to(torch.float16).float()), "curve", lo=2040, hi=2060),
    Entry("to-int8", "quantization", "cast to int8 and back (truncates, wraps)",
          _u(lambda x: x.to(torch.int8).float()), "curve", lo=-200, hi=200),
    Entry("quantize-per-tensor", "quantization", "torch.quantize_per_tensor to qint8 and back",
          lambda x, p=0.1: torch.quantize_per_tensor(x, p, 0, torch.qint8).dequantize(), "curve",
          Param("scale", 0.1, 0.001, 2.0), lo=-16, hi=16),
    Entry("fake-quantize-affine", "quantization", "torch.fake_quantize_per_tensor_affine",
          lambda x, p=0.25: torch.fake_quantize_per_tensor_affine(x, p, 0, -128, 127), "curve",
          Param("scale", 0.25, 0.001, 2.0)),
]


def _kernel(rows: list[list[float]]) -> torch.Tensor:
    """A 3x3 (or kxk) filter applied to each channel alone: (3, 1, k, k)."""
    k = torch.tensor(rows, dtype=torch.float32)
    return k.expand(3, 1, *k.shape).contiguous()


def _depthwise(x: torch.Tensor, k: list[list[float]]) -> torch.Tensor:
    w = _kernel(k).to(x.dtype)  # float64 too: the vendor path's reference
    return F.conv2d(x, w, padding=w.shape[-1] // 2, groups=3)


_GAUSS = [[1 / 16, 2 / 16, 1 / 16], [2 / 16, 4 / 16, 2 / 16], [1 / 16, 2 / 16, 1 / 16]]
_CONV = [
    Entry("box-blur", "convolution/pooling", "box blur (5x5 depthwise convolution)",
          _u(lambda x: _depthwise(x, [[1 / 25] * 5] * 5)), "image"),
    Entry("gaussian-blur", "convolution/pooling", "Gaussian blur (3x3)", _u(lambda x: _depthwise(x, _GAUSS)), "image"),
    Entry("sharpen", "convolution/pooling", "sharpen (3x3)",
          _u(lambda x: _depthwise(x, [[0, -1, 0], [-1, 5, -1], [0, -1, 0]])), "image"),
    Entry("sobel", "convolution/pooling", "Sobel edges (x and y)",
          _u(lambda x: _depthwise(x, [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]]).hypot(
              _depthwise(x, [[-1, -2, -1], [0, 0, 0], [1, 2, 1]]))), "image"),
    Entry("emboss", "convolution/pooling", "emboss (3x3)",
          _u(lambda x: _depthwise(x, [[-2, -1, 0], [-1, 1, 1], [0, 1, 2]]) * 0.5 + 0.5), "image"),
    Entry("max-pool", "convolution/pooling", "max pooling 4x4", _u(lambda x: F.max_pool2d(x, 4)), "image"),
    Entry("avg-pool", "convolution/pooling", "average pooling 4x4", _u(lambda x: F.avg_pool2d(x, 4)), "image"),
    Entry("min-pool", "convolution/pooling", "min pooling 4x4 (-maxpool(-x))", _u(lambda x: -F.max_pool2d(-x, 4)),
          "image"),
    Entry("adaptive-avg-pool", "convolution/pooling", "adaptive average pooling to 16x16",
          _u(lambda x: F.adaptive_avg_pool2d(x, 16)), "image"),
    Entry("grayscale-conv", "convolution/pooling", "1x1 convolution: RGB to luma",
          _u(lambda x: F.conv2d(x, torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(1, 3, 1, 1))),
          "image"),
]

_MATMUL = [
    Entry("matmul", "matmul", "A @ B", _b(torch.matmul), "matrix"),
    Entry("addmm", "matmul", "A @ B + 1 (addmm)",
          _b(lambda a, b: torch.addmm(torch.ones(b.shape[1], dtype=a.dtype), a, b)), "matrix"),
    Entry("gram", "matmul", "A @ A^T (Gram matrix)", _b(lambda a, b: a @ a.T), "matrix"),
    Entry("matvec", "matmul", "A @ (first column of B)", _b(lambda a, b: (a @ b[:, :1].contiguous())), "matrix"),
    Entry("bmm", "matmul", "batched: [A, 2A] @ B", _b(lambda a, b: torch.bmm(torch.stack([a, 2 * a]),
                                                                             torch.stack([b, b]))), "matrix"),
    Entry("linear-relu", "matmul", "relu(A @ B) (a linear layer)", _b(lambda a, b: torch.relu(a @ b)), "matrix"),
    Entry("outer", "matmul", "outer product of A's first column and B's first row",
          _b(lambda a, b: torch.outer(a[:, 0], b[0])), "matrix"),
]

_SHAPE = [
    Entry("transpose", "shape", "transpose H and W (copied)", _u(lambda x: x.transpose(-1, -2).contiguous()), "image"),
    Entry("channels-last", "shape", "to channels-last (N, H, W, C)", _u(lambda x: x.permute(0, 2, 3, 1).contiguous()),
          "image"),
    Entry("crop-brighten", "shape", "crop the centre half, brighten", _u(
        lambda x: x[..., x.shape[-2] // 4: 3 * x.shape[-2] // 4, x.shape[-1] // 4: 3 * x.shape[-1] // 4] * 1.3),
        "image"),
    Entry("luma", "shape", "channels mixed to luma (slices of C)",
          _u(lambda x: x[:, 0:1] * 0.299 + x[:, 1:2] * 0.587 + x[:, 2:3] * 0.114), "image"),
    Entry("broadcast-tint", "shape", "broadcast a per-channel tint", _u(lambda x: x * torch.full((3, 1, 1), 0.8) +
                                                                         torch.full((1, 1, 1), 0.1)), "image"),
    Entry("flip", "shape", "mirror left-right", _u(lambda x: x.flip(-1)), "image"),
    Entry("bgr", "shape", "swap red and blue", _u(lambda x: x.flip(1)), "image"),
    Entry("roll", "shape", "roll by a quarter", _u(lambda x: x.roll(x.shape[-1] // 4, -1)), "image"),
    Entry("pad", "shape", "reflection pad", _u(lambda x: F.pad(x, (16, 16, 16, 16), mode="reflect")), "image"),
    Entry("tile", "shape", "tile 2x2 (repeat)", _u(lambda x: x.repeat(1, 1, 2, 2)), "image"),
    Entry("pixel-unshuffle", "shape", "pixel unshuffle then shuffle back shifted",
          _u(lambda x: F.pixel_shuffle(F.pixel_unshuffle(x, 2).roll(1, 1), 2)), "image"),
]

_RESIZE = [
    Entry("nearest-up", "resize/sampling", "nearest upsampling x2", _u(lambda x: F.interpolate(x, scale_factor=2)),
          "image"),
    Entry("bilinear-up", "resize/sampling", "bilinear upsampling x2",
          _u(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")), "image"),
    Entry("bicubic-up", "resize/sampling", "bicubic upsampling x2",
          _u(lambda x: F.interpolate(x, scale_factor=2, mode="bicubic").clamp(0, 1)), "image"),
    Entry("nearest-down", "resize/sampling", "nearest downsampling /4 (aliases)",
          _u(lambda x: F.interpolate(x, scale_factor=0.25)), "image"),
    Entry("area-down", "resize/sampling", "area downsampling /4", _u(lambda x: F.interpolate(x, scale_factor=0.25,
                                                                                             mode="area")), "image"),
    Entry("rotate", "resize/sampling", "rotate by an angle (grid_sample)",
          lambda x, p=20.0: F.grid_sample(x, F.affine_grid(torch.tensor([[
              [math.cos(math.radians(p)), -math.sin(math.radians(p)), 0.0],
              [math.sin(math.radians(p)), math.cos(math.radians(p)), 0.0]]], dtype=x.dtype), list(x.shape),
              align_corners=False),
              align_corners=False), "image", Param("degrees", 20.0, -180.0, 180.0)),
    Entry("zoom", "resize/sampling", "zoom in x1.5 (affine grid)",
          _u(lambda x: F.grid_sample(x, F.affine_grid(torch.tensor([[[0.66, 0.0, 0.0], [0.0, 0.66, 0.0]]],
                                                                   dtype=x.dtype),
                                                      list(x.shape), align_corners=False), align_corners=False)),
          "image"),
]

_SIGNAL = [
    Entry("rfft", "signal", "|rfft(x)|", _u(lambda x: torch.fft.rfft(x).abs()), "signal",
          Param("frequency", 24.0, 1.0, 200.0)),
    Entry("fft", "signal", "|fft(x)|", _u(lambda x: torch.fft.fft(x).abs()), "signal",
          Param("frequency", 24.0, 1.0, 200.0)),
    Entry("power-spectrum", "signal", "power spectrum |rfft(x)|^2 / n",
          _u(lambda x: torch.fft.rfft(x).abs().pow(2) / x.shape[0]), "signal", Param("frequency", 24.0, 1.0, 200.0)),
    Entry("stft", "signal", "STFT magnitude (window 64)",
          _u(lambda x: torch.stft(x, 64, window=torch.hann_window(64), return_complex=True).abs()), "signal",
          Param("frequency", 24.0, 1.0, 200.0), picture="heatmap"),
    Entry("lowpass", "signal", "low-pass: irfft of the first tenth of rfft",
          _u(lambda x: torch.fft.irfft(torch.fft.rfft(x) * (torch.arange(x.shape[0] // 2 + 1) < x.shape[0] // 20),
                                       x.shape[0])), "signal", Param("frequency", 24.0, 1.0, 200.0),
          picture="filtered"),
    Entry("hann-window", "signal", "Hann window applied (before a DFT)",
          _u(lambda x: x * (0.5 - 0.5 * torch.cos(2 * math.pi * torch.arange(x.shape[0]) / x.shape[0]))), "signal",
          Param("frequency", 24.0, 1.0, 200.0), picture="filtered"),
    Entry("dc-remove", "signal", "remove the mean (DC)", _u(lambda x: x - x.mean()), "signal",
          Param("frequency", 24.0, 1.0, 200.0), picture="filtered"),
]

_SEQ = [
    Entry("cumsum", "sequence/control", "cumulative sum (a random walk)", _u(lambda x: torch.cumsum(x, 0)), "series"),
    Entry("cumprod", "sequence/control", "cumulative product of 1 + x/20", _u(lambda x: torch.cumprod(1 + x / 20, 0)),
          "series"),
    Entry("cummax", "sequence/control", "running maximum", _u(lambda x: torch.cummax(x, 0).values), "series"),
    Entry("logcumsumexp", "sequence/control", "log-cumsum-exp", _u(lambda x: torch.logcumsumexp(x, 0)), "series"),
    Entry("sort", "sequence/control", "sort", _u(lambda x: torch.sort(x).values), "series"),
    Entry("argsort", "sequence/control", "argsort (as float)", _u(lambda x: torch.argsort(x).float()), "series"),
    Entry("topk", "sequence/control", "top 10 values", _u(lambda x: torch.topk(x, min(10, x.shape[0])).values),
          "series"),
    Entry("diff", "sequence/control", "first difference x[i+1] - x[i]", _u(lambda x: x[1:] - x[:-1]), "series"),
    Entry("moving-average", "sequence/control", "moving average of 9 (a 1-D convolution)",
          _u(lambda x: F.avg_pool1d(x[None, None], 9, 1, 4)[0, 0]), "series"),
]



def _chunked_decay_sum(x: torch.Tensor, chunks: int = 8) -> torch.Tensor:
    """A running sum that halves at each chunk boundary, walked chunk by chunk in Python as chunked scans are (the
    gated delta rule's loop, forge.capture.scans): export unrolls it, so it is several tasks, not one."""
    state, out = x.new_zeros(()), []
    for part in x.tensor_split(chunks):
        if part.numel():
            local = torch.cumsum(part, 0) + state
            out.append(local)
            state = 0.5 * local[-1]
    return torch.cat(out)


_SCAN = [
    Entry("chunked-decay-sum", "scan", "running sum halved at each of 8 chunks (a loop over chunks)",
          _u(_chunked_decay_sum), "series"),
]

_OTHER = [
    Entry("nan-to-num", "other", "log(x) with -inf replaced (nan_to_num)",
          _u(lambda x: torch.nan_to_num(torch.log(x), neginf=-5.0)), "curve", lo=-1, hi=4),
    Entry("heaviside", "other", "heaviside(x, y)", _b(torch.heaviside), "curve2", Param("y", 0.5, 0, 1)),
    Entry("copysign", "other", "copysign(y, x)", _b(lambda x, y: torch.copysign(y, x)), "curve2",
          Param("y", 2.0, -4, 4)),
    Entry("lerp", "other", "lerp(x, y, 0.3)", _b(lambda x, y: torch.lerp(x, y, 0.3)), "curve2", Param("y", 2.0, -4, 4)),
    Entry("frac", "other", "fractional part", _u(torch.frac), "curve"),
    Entry("cdist", "other", "pairwise distances of A's rows and B's columns",
          _b(lambda a, b: torch.cdist(a[:, :8].contiguous(), b[:8].T.contiguous())), "matrix"),
    Entry("histc", "other", "histogram with 32 bins (histc)", _u(lambda x: torch.histc(x, 32, -3, 3)), "series"),
    Entry("bucketize", "other", "bucketize into 8 levels", _u(lambda x: torch.bucketize(
        x, torch.linspace(-2, 2, 7)).float()), "series"),
]

MORE: list[Entry] = _ATTN + _QUANT + _CONV + _MATMUL + _SHAPE + _RESIZE + _SIGNAL + _SEQ + _SCAN + _OTHER
