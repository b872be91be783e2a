"""Which side of CUDA IPC may be another user (issue 13): forge's judge runs as root, a worker as `nobody`.

Run as root on a GPU machine. Four cases, each a fresh child process that exchanges one buffer with this one:
- judge_exports: this process (root) allocates and exports, the child (nobody, or root as control) opens it;
- worker_exports: the child allocates and exports, this process opens it; then the child is killed and this
  process reads and writes the buffer again and runs a matmul (does the exporter's death harm the importer?).
Prints a table and writes JSON to argv[1].
"""

from __future__ import annotations

import json
import os
import pickle
import pwd
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import stamp  # noqa: E402
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

N = 1 << 24


def _child(mode: str) -> None:
    out = sys.stdout.buffer
    inp = sys.stdin.buffer
    torch.cuda.init()
    if mode == "export":
        pool = torch.cuda.MemPool(no_split=True)
        with torch.cuda.use_mem_pool(pool, device=0):
            buf = torch.empty(N, dtype=torch.uint8, device="cuda")
        buf.fill_(7)
        torch.cuda.synchronize()
        args = tuple(reduce_tensor(buf)[1])
        pickle.dump(args, out)
        out.flush()
        pickle.load(inp)  # the parent wrote 9s
        torch.cuda.synchronize()
        pickle.dump(int((buf == 9).sum()), out)
        out.flush()
        time.sleep(3600)
    else:
        args = list(pickle.load(inp))
        args[6] = 0
        try:
            buf = rebuild_cuda_tensor(*args)
            ok = int((buf == 7).sum())
            buf.fill_(9)
            torch.cuda.synchronize()
            pickle.dump(("ok", ok), out)
        except Exception as e:  # noqa: BLE001 - the probe reports it
            pickle.dump(("error", repr(e)[:300]), out)
        out.flush()


def _start(mode: str, user: str) -> subprocess.Popen:
    ent = pwd.getpwnam(user)

    def drop() -> None:
        os.setgroups([])
        os.setresgid(ent.pw_gid, ent.pw_gid, ent.pw_gid)
        os.setresuid(ent.pw_uid, ent.pw_uid, ent.pw_uid)

    return subprocess.Popen([sys.executable, __file__, "--child", mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, preexec_fn=drop if user != "root" else None,
                            env={**os.environ, "HOME": "/tmp"})


def judge_exports(user: str) -> dict:
    pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(pool, device=0):
        buf = torch.empty(N, dtype=torch.uint8, device="cuda")
    buf.fill_(7)
    torch.cuda.synchronize()
    p = _start("import", user)
    pickle.dump(tuple(reduce_tensor(buf)[1]), p.stdin)
    p.stdin.flush()
    status, value = pickle.load(p.stdout)
    p.wait(60)
    torch.cuda.synchronize()
    return {"case": "judge_exports", "child": user, "status": status, "child_saw_7": value,
            "judge_sees_9": int((buf == 9).sum()) if status == "ok" else None}


def worker_exports(user: str) -> dict:
    p = _start("export", user)
    row: dict = {"case": "worker_exports", "child": user}
    try:
        args = list(pickle.load(p.stdout))
        buf = rebuild_cuda_tensor(*args)
        row["judge_saw_7"] = int((buf == 7).sum())
        buf.fill_(9)
        torch.cuda.synchronize()
        pickle.dump("go", p.stdin)
        p.stdin.flush()
        row["child_saw_9"] = pickle.load(p.stdout)
        p.kill()
        p.wait(60)
        time.sleep(1)
        buf.fill_(3)
        torch.cuda.synchronize()
        row["after_kill_reads_3"] = int((buf == 3).sum())
        a = torch.randn(2048, 2048, device="cuda")
        row["after_kill_matmul_ok"] = bool(torch.isfinite(a @ a).all())
        del buf
        torch.cuda.synchronize()
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - the probe reports it
        row["status"] = "error"
        row["error"] = repr(e)[:300]
        p.kill()
    return row


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[2])
        return
    torch.cuda.init()
    rows = []
    for user in ("root", "nobody"):
        rows.append(judge_exports(user))
        rows.append(worker_exports(user))
    for r in rows:
        print(r, flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({**stamp("cuda"), "uid": os.geteuid(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
