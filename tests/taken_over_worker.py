"""A worker process a candidate has taken over (issue 13, class C), for tests/test_judge.py.

Run as `python tests/taken_over_worker.py MODE FD_IN FD_OUT DEVICE [confine]`: patches what MODE names in
this process, as code that escaped into the interpreter could, then serves steps as forge.evaluate.child does.
- `none`: nothing (the control);
- `fast-clock`: the candidate's timed median reported 20x lower than measured;
- `slow-eager`: eager's timed median reported 1000x higher than measured (more than any load here slows it);
- `verifier`: forge.evaluate.verify's, forge.evaluate.verdicts' and forge.evaluate.spotcheck's judging made to
  pass everything (the judge is elsewhere);
- `forged-verdict`: every step answered with a verdict of its own (accepted, 1 us against eager's 1 s);
- `partial-reply`: every step answered with the start of a message, then nothing (forge must not wait forever);
- `opens-judge-memory`: opens forge's `/proc/<pid>/mem` for writing, as a kernel's host code could at run time,
  and prints what came of it ("judge memory: opened" or the error's name) to the worker's log, then serves;
- `writes=PATH`: writes into PATH (an existing file anyone may write, say) and then into a new file in its
  HOME (its scratch folder), and prints what came of each ("write PATH: done" or the error's name), then serves;
- `leaves-daemon`: forks a process that leaves the worker's session and sleeps, then serves;
- `who`: prints "user: NAME", the name getpass.getuser() gives (Inductor names its cache folder so), then
  serves;
- `signals-pid=PID`: asks to signal process PID (signal 0: the permission check alone), and prints what came
  of it ("signal: sent" or the error's name), then serves.
"""

import sys
from dataclasses import replace

import forge.evaluate.child
import forge.evaluate.spotcheck
import forge.evaluate.verdicts
import forge.evaluate.verify


def _scaled(candidate: float, eager: float):  # noqa: ANN202 - a patch
    real = forge.evaluate.child.interleaved

    def interleaved(clock, fns, cfg, prepare=None):  # noqa: ANN001, ANN202
        timing, baseline = real(clock, fns, cfg, prepare)
        return [replace(timing, median_us=timing.median_us * candidate), replace(baseline,
                median_us=baseline.median_us * eager)]
    return interleaved


mode, argv = sys.argv[1], sys.argv[2:]
if mode == "fast-clock":
    forge.evaluate.child.interleaved = _scaled(1 / 20, 1.0)
elif mode == "slow-eager":
    forge.evaluate.child.interleaved = _scaled(1.0, 1000.0)
elif mode == "verifier":
    forge.evaluate.verdicts.within_tolerance = lambda *a, **k: None
    forge.evaluate.verdicts.nonfinite = lambda *a, **k: None
    forge.evaluate.verdicts.rel_errors = lambda outs, *a, **k: [0.0] * len(outs)  # the name verdicts judges by
    forge.evaluate.verify.judge_output = lambda *a, **k: None
elif mode == "forged-verdict":
    from forge.kernel import EvalResult, Status, Timing

    fast, slow = Timing(1.0, 1.0, 1.0, 1.0, 0.0, 10), Timing(1e6, 1e6, 1e6, 1e6, 0.0, 10)
    forge.evaluate.child.handle = lambda msg, st: EvalResult(Status.OK, timing=fast, baseline=slow)
elif mode == "partial-reply":  # after the ready message: a header for 1000 bytes, 10 of them, then a stall
    import time
    from multiprocessing.connection import Connection

    hello = Connection.send

    def stalls(self, obj):  # noqa: ANN001, ANN202 - a patch
        if isinstance(obj, tuple) and obj and obj[0] == "ready":
            return hello(self, obj)
        self._send(b"\x00\x00\x03\xe8" + b"x" * 10)
        time.sleep(3600)
    Connection.send = stalls
elif mode == "opens-judge-memory":
    import os

    try:
        with open(f"/proc/{os.getppid()}/mem", "r+b"):
            print("judge memory: opened", flush=True)
    except OSError as e:
        print(f"judge memory: {type(e).__name__}", flush=True)
elif mode.startswith("signals-pid="):
    import os

    try:
        os.kill(int(mode.partition("=")[2]), 0)  # the permission check alone
        print("signal: sent", flush=True)
    except OSError as e:
        print(f"signal: {type(e).__name__}", flush=True)
elif mode.startswith("writes="):
    import os

    for path in (mode.partition("=")[2], os.path.join(os.environ["HOME"], "own")):
        try:
            with open(path, "r+b" if os.path.exists(path) else "wb") as f:
                f.write(b"taken")
            print(f"write {path}: done", flush=True)
        except OSError as e:
            print(f"write {path}: {type(e).__name__}", flush=True)
elif mode == "leaves-daemon":
    import os
    import time

    pid = os.fork()
    if pid == 0:  # a process in a session of its own, which outlives a kill of the worker's group
        os.setsid()
        time.sleep(600)
        os._exit(0)
    print(f"daemon: {pid}", flush=True)
elif mode == "who":
    import getpass

    print(f"user: {getpass.getuser()}", flush=True)
elif mode != "none":
    raise SystemExit(f"unknown mode {mode!r}")
sys.exit(forge.evaluate.child.main(argv))
