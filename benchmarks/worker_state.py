"""What a CUDA worker started here is: its user id, network namespace, seccomp filter, Landlock, root kept.

    python3 benchmarks/worker_state.py [--device cuda]

Prints one line each (the h200_*.sh scripts run it first).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.evaluate import landlock  # noqa: E402
from forge.evaluate.parent import Worker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    print("landlock abi", landlock.abi())
    with Worker(args.device) as w:
        w.start()
        print("worker uid", w.uid, "own_network", w.own_network, "confined", w.confined, "unconfined:",
              repr(w.unconfined), "kept root:", repr(w.privileged), "landlock:", w.allowed is not None)


if __name__ == "__main__":
    main()
