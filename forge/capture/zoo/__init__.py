"""Reference model zoo: full-size models built from configs shipped in the repo, with random weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

__all__ = ["NAMES", "SPECS", "ZooSpec", "build", "get_spec", "load_config"]


@dataclass(frozen=True)
class ZooSpec:
    """What one zoo model is, which inputs it takes and which build options apply to it."""

    name: str
    description: str
    package: str  # the optional package that provides the model class
    inputs: tuple[str, ...]  # names of the example inputs, in forward() order
    default_batch: int
    default_seq: int | None  # None: `seq` does not apply
    default_resolution: int | None  # None: `resolution` does not apply
    full_layers: int | None  # depth that `layers` cuts; None: `layers` does not apply
    blocks: bool = False  # profiled and optimized block-wise by default (forge.capture.blocks)

    @property
    def config_file(self) -> str:
        """File name of the shipped config in forge/capture/zoo/configs/."""
        return f"{self.name}.json"


SPECS: dict[str, ZooSpec] = {
    s.name: s
    for s in (
        ZooSpec(
            name="resnet50",
            description="torchvision ResNet-50 image classifier (ImageNet, 1000 classes)",
            package="torchvision",
            inputs=("images",),
            default_batch=32,
            default_seq=None,
            default_resolution=224,
            full_layers=None,
        ),
        ZooSpec(
            name="sd35-mmdit",
            description="Stable Diffusion 3.5 Medium MMDiT-X denoiser (diffusers SD3Transformer2DModel)",
            package="diffusers",
            inputs=("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"),
            default_batch=2,
            default_seq=333,
            default_resolution=1024,
            full_layers=24,
        ),
        ZooSpec(
            name="sd35-vae-decoder",
            description="Stable Diffusion 3.5 VAE decode path (diffusers AutoencoderKL.decode, 16 channels)",
            package="diffusers",
            inputs=("latents",),
            default_batch=1,
            default_seq=None,
            default_resolution=1024,
            full_layers=None,
        ),
        ZooSpec(
            name="gemma4",
            description="Gemma 4 E2B text decoder: prefill, last-position logits (Gemma4ForCausalLM)",
            package="transformers",
            inputs=("input_ids",),
            default_batch=1,
            default_seq=2048,
            default_resolution=None,
            full_layers=35,
        ),
        ZooSpec(
            name="qwen35",
            description="Qwen3.5-0.8B text decoder: prefill, last-position logits (Qwen3_5ForCausalLM)",
            package="transformers",
            inputs=("input_ids",),
            default_batch=1,
            default_seq=2048,
            default_resolution=None,
            full_layers=24,
            blocks=True,  # one capture per kind of block (19 s on meta at full size; whole: 28 s, 2716 ATen nodes)
        ),
    )
}

NAMES: tuple[str, ...] = tuple(SPECS)


def get_spec(name: str) -> ZooSpec:
    """Return the spec of zoo model `name`; ValueError listing the names if it is unknown."""
    try:
        return SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown zoo model {name!r}; choose one of: {', '.join(NAMES)}") from None


def load_config(name: str) -> dict[str, Any]:
    """Return the shipped JSON config of zoo model `name` (keys starting with '_' are metadata)."""
    spec = get_spec(name)
    text = resources.files(__name__).joinpath("configs", spec.config_file).read_text(encoding="utf-8")
    return json.loads(text)


def build(
    name: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    layers: int | None = None,
    batch: int | None = None,
    seq: int | None = None,
    resolution: int | None = None,
    seed: int = 0,
) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """Build zoo model `name` (eval mode, random weights, on `device` in `dtype`) and example inputs."""
    from forge.capture.zoo._build import build_model

    return build_model(
        get_spec(name),
        load_config(name),
        device=device,
        dtype=dtype,
        layers=layers,
        batch=batch,
        seq=seq,
        resolution=resolution,
        seed=seed,
    )
