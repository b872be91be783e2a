"""The sandbox of untrusted work: environments without credentials, resource limits for workers."""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Callable

# Names that hold credentials: whole-word API keys, tokens, secrets, passwords, and provider settings.
_SECRET = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION|COOKIE|PRIVATE_KEY|"
                     r"ACCESS_KEY|^AWS_|^AZURE_|^GOOGLE_APPLICATION|^OPENAI|^ANTHROPIC|^HF_|"
                     r"^HUGGING_FACE|^GH_|^GITHUB_|^NPM_|^PYPI)", re.I)
_KEEP = {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH",
         "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "CXX", "CC", "PYTHONPATH", "VIRTUAL_ENV",
         "TRITON_CACHE_DIR", "FORGE_CACHE", "XDG_CACHE_HOME", "NVIDIA_VISIBLE_DEVICES",
         "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}


def is_secret(name: str) -> bool:
    """True for an environment variable name that may hold a credential."""
    return bool(_SECRET.search(name))


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The current environment without credentials, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not is_secret(k) and (k in _KEEP or not k.startswith("_"))}
    env.update(extra or {})
    return env


def limits(memory_bytes: int | None, cpu_seconds: int | None) -> Callable[[], None]:
    """A preexec function for a worker: its own session, an address-space and a CPU-time limit."""

    def apply() -> None:
        os.setsid()  # Ctrl-C in the terminal reaches the parent only
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if cpu_seconds:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply
