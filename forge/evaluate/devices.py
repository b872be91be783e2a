"""What a device is: its nvcc architecture, and the model kernels are tuned for (results are compared, and
artifacts checked, per device model)."""

from __future__ import annotations

import platform
from pathlib import Path


def device_arch(device: str) -> str | None:
    """The nvcc architecture of a CUDA device ("sm_90"), asked of torch in this process (no context)."""
    if not device.startswith("cuda"):
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def device_model(device: str) -> str:
    """What kernels are tuned for: the GPU's name and compute capability, or the CPU's model and ISA."""
    if device.startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(device)} {device_arch(device)}"
    name, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() == "flags" and not flags:  # the vector ISA -march=native builds for
                flags = " ".join(sorted(f for f in value.split() if f.startswith(("avx", "sse", "fma", "amx"))))
    except OSError:
        pass
    name = name or platform.processor()
    return f"{platform.machine()} {name} [{flags}]"
