"""Builders behind forge.capture.zoo.build: option checks, model construction, wrappers and example inputs."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from forge.capture.zoo import ZooSpec

_INSTALL_HINT = "pip install 'forge-kernels[zoo]'"


@dataclass(frozen=True)
class _Opts:
    """The build options as the caller gave them (None: use the model's default)."""

    device: torch.device
    dtype: torch.dtype
    layers: int | None
    batch: int | None
    seq: int | None
    resolution: int | None
    seed: int


# --------------------------------------------------------------------------------------------- helpers


def _require(module: str, model: str) -> Any:
    """Import optional package `module` or raise ImportError telling how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"zoo model {model!r} needs the optional package {module!r} ({e}); "
            f"install it with: {_INSTALL_HINT}"
        ) from e


def _is_int(value: Any) -> bool:
    """True for a plain int (bools excluded)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(what: str, value: Any, lo: int, hi: int | None, model: str) -> int:
    """Return `value` if it is an int in [lo, hi], else raise a one-line ValueError."""
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        where = f"an integer between {lo} and {hi}" if hi is not None else f"an integer >= {lo}"
        raise ValueError(f"{what} for {model!r} must be {where}, got {value!r}")
    return value


def _check_multiple(what: str, value: Any, step: int, hi: int | None, model: str) -> int:
    """Return `value` if it is a positive multiple of `step` (at most `hi`), else raise a ValueError."""
    if not _is_int(value) or value <= 0 or value % step or (hi is not None and value > hi):
        limit = f" up to {hi}" if hi is not None else ""
        raise ValueError(f"{what} for {model!r} must be a positive multiple of {step}{limit}, got {value!r}")
    return value


def _reject(what: str, value: Any, model: str, why: str) -> None:
    """Raise a one-line ValueError if option `what` was given to a model it does not apply to."""
    if value is not None:
        raise ValueError(f"{what!r} does not apply to {model!r} ({why})")


def _or(value: Any, default: Any) -> Any:
    """`value` unless it is None."""
    return default if value is None else value


def _hparams(config: dict[str, Any]) -> dict[str, Any]:
    """Config without its metadata keys (those starting with '_')."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


@contextlib.contextmanager
def _construct(device: torch.device, seed: int) -> Iterator[None]:
    """Create modules directly on `device` with a seeded RNG, leaving the caller's RNG state untouched."""
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices), device:
        torch.manual_seed(seed)
        yield


def _randn(shape: tuple[int, ...], o: _Opts, gen: torch.Generator) -> torch.Tensor:
    """Standard-normal tensor in o.dtype, drawn on CPU from `gen` (same on any device); empty on meta."""
    if o.device.type == "meta":
        return torch.empty(shape, dtype=o.dtype, device=o.device)
    return torch.randn(shape, generator=gen).to(device=o.device, dtype=o.dtype)


def _token_ids(vocab: int, shape: tuple[int, ...], o: _Opts, gen: torch.Generator) -> torch.Tensor:
    """int64 token ids uniform in [0, vocab), drawn on CPU from `gen`; empty on meta."""
    if o.device.type == "meta":
        return torch.empty(shape, dtype=torch.int64, device=o.device)
    return torch.randint(0, vocab, shape, generator=gen).to(o.device)


def _timesteps(batch: int, o: _Opts, gen: torch.Generator) -> torch.Tensor:
    """Flow-matching timesteps, floats uniform in [0, 1000) in o.dtype; empty on meta."""
    if o.device.type == "meta":
        return torch.empty((batch,), dtype=o.dtype, device=o.device)
    return (torch.rand((batch,), generator=gen) * 1000).to(device=o.device, dtype=o.dtype)


def _finish(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """Cast to `dtype` (unless None: already built in it), freeze the weights and switch to eval mode."""
    if dtype is not None:
        model = model.to(dtype=dtype)
    model.requires_grad_(False)
    return model.eval()


# --------------------------------------------------------------------------------------------- wrappers


class MMDiT(nn.Module):
    """SD3 transformer taking plain tensors and returning the predicted latent tensor (`.sample`)."""

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        pooled_projections: torch.Tensor,
        timestep: torch.Tensor,
    ) -> torch.Tensor:
        """Denoise latents [b,16,h,w] given text embeddings [b,t,4096], pooled [b,2048] and timestep [b]."""
        return self.transformer(
            hidden_states=hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            pooled_projections=pooled_projections,
            timestep=timestep,
            return_dict=False,
        )[0]


class VAEDecoder(nn.Module):
    """AutoencoderKL decode path: forward(latents) returns `vae.decode(latents).sample`."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        # decode() never touches the encoder side: drop it so the module holds the decode weights only.
        vae.encoder = None
        vae.quant_conv = None
        self.vae = vae

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode latents [b,16,h/8,w/8] into images [b,3,h,w]."""
        return self.vae.decode(latents, return_dict=False)[0]


class LastTokenLogits(nn.Module):
    """Causal LM prefill without KV cache that returns the logits of the last position only."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt `input_ids` [b,s]; returns the logits [b,1,vocab] of position s-1."""
        return self.lm(input_ids=input_ids, use_cache=False, logits_to_keep=1, return_dict=True).logits


# --------------------------------------------------------------------------------------------- builders

_Built = tuple[nn.Module, list[torch.Tensor], torch.dtype | None]  # model, inputs, dtype to cast to


def _build_resnet50(spec: ZooSpec, config: dict[str, Any], o: _Opts, gen: torch.Generator) -> _Built:
    """torchvision ResNet-50 with weights=None."""
    name = spec.name
    _reject("layers", o.layers, name, "ResNet-50's stages differ, there is no uniform block stack to cut")
    _reject("seq", o.seq, name, "it takes images")
    batch = _check_int("batch", _or(o.batch, spec.default_batch), 1, None, name)
    res = _check_int("resolution", _or(o.resolution, spec.default_resolution), 32, None, name)
    models = _require("torchvision.models", name)
    with _construct(o.device, o.seed):
        model = models.resnet50(weights=None, **_hparams(config))
    return model, [_randn((batch, 3, res, res), o, gen)], o.dtype


def _build_sd35_mmdit(spec: ZooSpec, config: dict[str, Any], o: _Opts, gen: torch.Generator) -> _Built:
    """diffusers SD3Transformer2DModel with the SD3.5 Medium config, wrapped to take and return tensors."""
    name = spec.name
    hp = _hparams(config)
    if o.layers is not None:
        n = _check_int("layers", o.layers, 1, hp["num_layers"], name)
        hp["num_layers"] = n
        hp["dual_attention_layers"] = [i for i in hp["dual_attention_layers"] if i < n]
    batch = _check_int("batch", _or(o.batch, spec.default_batch), 1, None, name)
    seq = _check_int("seq", _or(o.seq, spec.default_seq), 1, None, name)
    # latent side = resolution / 8, cut in 2x2 patches; the position table covers pos_embed_max_size patches
    step = 8 * hp["patch_size"]
    res = _check_multiple("resolution", _or(o.resolution, spec.default_resolution), step,
                          step * hp["pos_embed_max_size"], name)  # fmt: skip
    diffusers = _require("diffusers", name)
    with _construct(o.device, o.seed):
        transformer = diffusers.SD3Transformer2DModel(**hp)
    lat = res // 8
    inputs = [
        _randn((batch, hp["in_channels"], lat, lat), o, gen),
        _randn((batch, seq, hp["joint_attention_dim"]), o, gen),
        _randn((batch, hp["pooled_projection_dim"]), o, gen),
        _timesteps(batch, o, gen),
    ]
    return MMDiT(transformer), inputs, o.dtype


def _build_sd35_vae_decoder(spec: ZooSpec, config: dict[str, Any], o: _Opts, gen: torch.Generator) -> _Built:
    """diffusers AutoencoderKL with the SD3.5 VAE config; the module is its decode path."""
    name = spec.name
    _reject("layers", o.layers, name, "the decoder is a fixed up-sampling stack of different blocks")
    _reject("seq", o.seq, name, "it takes image latents")
    hp = _hparams(config)
    batch = _check_int("batch", _or(o.batch, spec.default_batch), 1, None, name)
    res = _check_multiple("resolution", _or(o.resolution, spec.default_resolution), 8, None, name)
    diffusers = _require("diffusers", name)
    with _construct(o.device, o.seed):
        vae = diffusers.AutoencoderKL(**hp)
    latents = _randn((batch, hp["latent_channels"], res // 8, res // 8), o, gen)
    return VAEDecoder(vae), [latents], o.dtype


def _build_causal_lm(spec: ZooSpec, config: dict[str, Any], o: _Opts, gen: torch.Generator) -> _Built:
    """transformers text decoder (Gemma 4 or Qwen 3.5) behind a last-position-logits wrapper."""
    name = spec.name
    _reject("resolution", o.resolution, name, "it takes token ids")
    hp = _hparams(config)
    full = hp["num_hidden_layers"]
    n = _check_int("layers", _or(o.layers, full), 1, full, name)
    # keep decoder layers 0..n-1 of the full model, with their entries of the per-layer attention pattern
    hp["num_hidden_layers"] = n
    hp["layer_types"] = list(hp["layer_types"][:n])
    batch = _check_int("batch", _or(o.batch, spec.default_batch), 1, None, name)
    seq = _check_int("seq", _or(o.seq, spec.default_seq), 1, hp["max_position_embeddings"], name)
    transformers = _require("transformers", name)
    if name == "gemma4":
        # layers at index >= full - num_kv_shared_layers reuse the K/V of the last earlier layer of their type
        hp["num_kv_shared_layers"] = max(0, n - (full - hp["num_kv_shared_layers"]))
        # transformers requires a global-attention last layer (it would force it, with a warning)
        hp["layer_types"][-1] = "full_attention"
        config_cls, model_cls = transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM
    else:
        config_cls, model_cls = transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM
    hf_config = config_cls(**hp)
    # Construct on meta (no per-layer torch default init), then materialize and run transformers' own init
    # once, as from_pretrained does for weights missing from a checkpoint (this also fills the RoPE buffers).
    # Built in dtype directly: transformers keeps RoPE inverse frequencies in float32; a cast would round.
    with torch.device("meta"):
        lm = model_cls._from_config(hf_config, dtype=o.dtype, attn_implementation="sdpa")
    if o.device.type != "meta":
        with _construct(o.device, o.seed):
            lm = lm.to_empty(device=o.device)
            for key in getattr(lm, "all_tied_weights_keys", {}):  # tie_weights overwrites them: skip init
                lm.get_parameter(key)._is_hf_initialized = True
            lm.initialize_weights()
            lm.tie_weights()
    input_ids = _token_ids(hp["vocab_size"], (batch, seq), o, gen)
    return LastTokenLogits(lm), [input_ids], None


_BUILDERS: dict[str, Callable[[ZooSpec, dict[str, Any], _Opts, torch.Generator], _Built]] = {
    "resnet50": _build_resnet50,
    "sd35-mmdit": _build_sd35_mmdit,
    "sd35-vae-decoder": _build_sd35_vae_decoder,
    "gemma4": _build_causal_lm,
    "qwen35": _build_causal_lm,
}


def build_model(
    spec: ZooSpec,
    config: dict[str, Any],
    *,
    device: str | torch.device,
    dtype: torch.dtype,
    layers: int | None,
    batch: int | None,
    seq: int | None,
    resolution: int | None,
    seed: int,
) -> tuple[nn.Module, list[torch.Tensor]]:
    """Check the options, build the wrapped model and its example inputs (see forge.capture.zoo.build)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype for {spec.name!r} must be a floating-point torch.dtype, got {dtype!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"invalid device {device!r} for {spec.name!r}: {e}") from None
    if not _is_int(seed):
        raise ValueError(f"seed for {spec.name!r} must be an integer, got {seed!r}")
    opts = _Opts(dev, dtype, layers, batch, seq, resolution, seed)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    model, inputs, cast_to = _BUILDERS[spec.name](spec, config, opts, gen)
    return _finish(model, cast_to), inputs
