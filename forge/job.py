"""forge optimize: profile -> search every task -> bundle the winners -> apply -> measure end to end."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from forge.capture.export import Capture
from forge.capture.model_input import LoadedModel, state_kept
from forge.capture.profile import Profile, profile_blockwise, profile_model
from forge.errors import Interrupted, RunFailed, UserError
from forge.evaluate.build import build
from forge.evaluate.cluster import evaluator_for
from forge.evaluate.evaluator import BaseEvaluator as Evaluator
from forge.evaluate.pool import Scale
from forge.kernel import KernelArtifact
from forge.policy.base import Policy
from forge.policy.recipes.policy import RecipePolicy
from forge.progress import Progress
from forge.runtime import artifact
from forge.runtime.endtoend import alternate
from forge.runtime.variants import GAIN, TRIVIAL, Ahead, Measured, Variant, choose, measure_floor
from forge.runtime.variants_blocks import choose_blockwise
from forge.search.driver import Budget, TaskOutcome, search
from forge.store import RunRecord, Store, TaskRecord
from forge.store.recorder import StoreRecorder
from forge.tasks.cut import Task

log = logging.getLogger(__name__)

# Of a run's --seconds, the search gets the first part; no Inductor compilation of the result starts after
# the second fraction (a compilation of a reference model takes 10-60 s on an H200's host), nor one that would
# end after the third, judged by the one before it (the final timing and the artifact take the rest). The
# search's half: of 300 s on the SD3.5 VAE (c0bf830, a 0.55 share) the variants' chains and a first 35 s
# compilation left the second one, the one with forge's kernels, 1 s short of the third fraction. On a GPU the
# first compilation (torch.compile's own result, the floor) is measured before the search, out of its share
# (forge.runtime.variants.measure_floor): after it, on Gemma 4 and the SD3.5 MMDiT (0d9eb0b, and dda6433 with a
# 0.4 share) it left no time for the second, and forge's result was torch.compile's own. With the floor ahead but
# the chain without kernels after the search (0ea6aef), Gemma 4's second compilation missed again (judged at
# ~220 s by a 67 s floor): the search ran past its share re-timing winners. So the chain without kernels is
# measured ahead too, and the search ends early enough for what follows it (_search_seconds).
_SEARCH_SHARE, _COMPILE_BY, _COMPILE_END = 0.5, 0.8, 0.95


@dataclass(frozen=True)
class OptimizeReport:
    """The result of a run, as the documented JSON has it."""

    run_id: str
    device: str
    policy: str
    eager_ms: float
    forge_ms: float
    outputs_match: bool
    max_rel_err: float
    applied: bool  # False: no variant (forge.runtime.variants) was 1% faster than eager, so forge returns eager
    patched_ms: float  # the found kernels with no rewrite (a CUDA graph on CUDA), applied or not
    cuda_graph: bool  # the model you get replays the patched forward as a CUDA graph
    graph_ms: float | None  # the patched model's time as a CUDA graph (CUDA only), used or not
    graph_note: str  # why it could not be captured, if it could not
    tasks: tuple[TaskOutcome, ...]
    artifact: str
    cost: dict[str, float]
    variant: Variant | None = None  # what the model you get is made of (None: eager, nothing was faster)
    variants: tuple[Measured, ...] = ()  # every variant measured end to end, in the order tried
    peak_mem_ratio: float | None = None  # CUDA: peak device memory of a forward of the result over eager's
    layout: str = ""  # the activation layout captured and searched in (forge.capture.layout; "": as given)
    mode: str = "eval"  # the model's mode, in which it was captured, searched, measured and compared: train | eval

    @property
    def speedup(self) -> float:
        """Eager over forge, end to end."""
        return self.eager_ms / self.forge_ms if self.forge_ms else 0.0

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (docs/optimize-format.md)."""
        return {
            "run_id": self.run_id, "device": self.device, "policy": self.policy, "eager_ms": self.eager_ms,
            "forge_ms": self.forge_ms, "speedup": self.speedup, "outputs_match": self.outputs_match,
            "max_rel_err": self.max_rel_err, "applied": self.applied, "patched_ms": self.patched_ms,
            "cuda_graph": self.cuda_graph, "graph_ms": self.graph_ms, "graph_note": self.graph_note,
            "artifact": self.artifact, "variant": self.variant.to_json() if self.variant else None,
            "variants": [m.to_json() for m in self.variants], "peak_mem_ratio": self.peak_mem_ratio,
            "layout": self.layout or "row-major", "mode": self.mode,
            "tasks": [{"key": t.key, "family": t.family, "share": t.share, "eager_us": t.eager_us,
                       "best_us": t.best_us, "floor_us": t.floor_us, "speedup": t.speedup,
                       "speedup_ci": list(t.speedup_ci) if t.speedup_ci else None, "noisy": t.noisy,
                       "candidates": t.candidates, "status": t.status, "stop_reason": t.stop_reason}
                      for t in self.tasks],
            "cost": self.cost,
        }


def _eager_ms(loaded: LoadedModel) -> float:
    """Eager's time alone, for a run where no variant could be measured."""
    return statistics.median(alternate([lambda: loaded.model(*loaded.inputs)], loaded.device)[0])


# the offline ones: no key, no --max-usd, nothing to replay
RECIPE_POLICIES = ("recipes", "recipes+triton", "recipes+helion")


def make_policy(name: str, device: str, **llm: Any) -> Policy:
    """The policy named on the command line: `recipes`, or an LLM (`openai:MODEL`, `recipes+anthropic:MODEL`,
    ...; `llm` holds store, max_usd, replay, prices: see forge.policy.llm.make_llm_policy). Bad input is a UserError.
    """
    if name in RECIPE_POLICIES:  # Triton's and Helion's lowerings beside CUDA's only when asked: not yet measured
        return RecipePolicy(device, triton=name == "recipes+triton", helion=name == "recipes+helion")
    from forge.policy.llm import make_llm_policy

    return make_llm_policy(name, device, **llm)


def resumable(store: Store, run_id: str) -> RunRecord:
    """The stored run `run_id` if it can be resumed; UserError if it is unknown or already finished."""
    try:
        run = store.get_run(run_id)
    except KeyError:
        raise UserError(f"no run {run_id!r} in the store {store.where} (forge runs lists its runs; --db PATH|URL or "
                        "FORGE_DB=PATH|URL points at another store)") from None
    if run.state == "done":
        raise UserError(f"run {run_id} already finished ({run.finished_at:%Y-%m-%d %H:%M}, eager "
                        f"{run.eager_ms or 0:.3f} ms, forge {run.forge_ms or 0:.3f} ms); nothing to resume")
    if "budget" not in run.config:
        raise UserError(f"run {run_id} was not made by forge optimize ({run.policy or 'no policy'}); "
                        "only optimize runs resume")
    return run


OUT_ENV = "FORGE_OUT"  # the folder of the runs' artifacts when no --out (runs_dir=) is given


def artifacts_root(store: Store, out: str | Path | None = None) -> Path:
    """Where a run's artifact folder goes, absolute: `out`, else $FORGE_OUT, else the folder of the SQLite store
    (runs/ for the default runs/forge.db, /x/ for /x/forge.db), else (a database server) runs/ here."""
    out = out or os.environ.get(OUT_ENV) or (store.file.parent if store.file is not None else "runs")
    return Path(out).expanduser().resolve()


def _artifact_folder(store: Store, run: RunRecord, out: str | Path | None) -> Path:
    """The run's artifact folder, recorded in its config: a resumed run keeps the one it started with unless
    `out` is given."""
    stored = run.config.get("artifact")
    folder = Path(stored) if stored and not out else artifacts_root(store, out) / run.id
    if str(folder) != stored:
        store.update_run(run.id, config={**run.config, "artifact": str(folder)})
    return folder


def _check_same_model(run: RunRecord, loaded: LoadedModel, keys: set[str], tasks: list[TaskRecord]) -> None:
    """UserError unless `loaded` is the model, device and dtype the run was started with."""
    load = run.config.get("load", {})
    same = (Path(load["file"]).resolve() == Path(loaded.name).resolve()) if load.get("file") and \
        not loaded.name.startswith("zoo:") else run.model == loaded.name
    if not same or (run.device, run.dtype) != (loaded.device, loaded.dtype):
        raise UserError(f"run {run.id} optimized {run.model} on {run.device} ({run.dtype}), not {loaded.name} on "
                        f"{loaded.device} ({loaded.dtype}); resume it with the same model or without a model")
    if run.config.get("mode", "eval") != loaded.mode:
        raise UserError(f"run {run.id} optimized {run.model} in {run.config.get('mode', 'eval')} mode, not "
                        f"{loaded.mode}; resume it in the same mode ({'with' if loaded.mode == 'train' else 'without'}"
                        " --eval)")
    missing = [t.key for t in tasks if t.key not in keys]
    if missing:
        raise UserError(f"{loaded.name} is not the model run {run.id} started with: its task {missing[0]} is "
                        "gone (was the file edited?)")


def optimize(loaded: LoadedModel, store: Store, *, policy: str | Policy = "recipes", budget: Budget | None = None,
             runs_dir: str | Path | None = None, progress: Progress | None = None, resume: str | None = None,
             load: dict[str, Any] | None = None, profile_out: str | Path | None = None,
             inductor: bool = True, layout: str | None = None, blocks: bool = False,
             scale: Scale | None = None) -> OptimizeReport:
    """The whole job; every candidate and evaluation is stored as it happens.

    `resume` continues a stopped or killed run (its id) with its stored budget, trees and decisions; no
    stored candidate is evaluated again. `load` (how the model was loaded) is kept in the run's config.
    `runs_dir`: the artifact goes to runs_dir/<run id>/ (None: see `artifacts_root`; a resumed run: where it started
    to go); the run's config records that folder as `artifact`.
    `profile_out`: also write the profile the search starts from (forge profile's JSON) there.
    `inductor`: also measure the result compiled by torch.compile (forge.runtime.variants); the fastest variant wins.
    `layout`: the activation layout to capture and search in (forge.capture.layout; None: measured, the faster one).
    `blocks`: capture each kind of repeated block once and dispatch the kernels block by block
    (forge.capture.blocks, forge.runtime.blockwise; the model's own layout), where the model has such blocks.
    `progress` hears the run's stages and the search's events (forge.progress; the library never prints).
    `scale`: where candidates are judged (forge.evaluate.pool.Scale: workers per GPU, CPU workers, a Ray cluster;
    default one worker on the model's device): the probe runs several tasks at once, and later batches fill them.
    """
    with state_kept(loaded.model):  # forge's own forwards in training mode leave the running statistics as given
        return _job(loaded, store, policy, budget, runs_dir, progress, resume, load, profile_out, inductor,
                    layout, blocks, scale or Scale())


def _job(loaded: LoadedModel, store: Store, policy: str | Policy, budget: Budget | None, runs_dir: str | Path | None,
         progress: Progress | None, resume: str | None, load: dict[str, Any] | None, profile_out: str | Path | None,
         inductor: bool, layout: str | None, blocks: bool, scale: Scale) -> OptimizeReport:
    """forge.job.optimize's steps (its docstring), the model's buffers restored after by the caller."""
    start = time.monotonic()
    shown = progress or Progress()
    pol = make_policy(policy, loaded.device) if isinstance(policy, str) else policy
    stored = resumable(store, resume) if resume else None
    seconds = Budget(**stored.config["budget"]).seconds if stored else (budget or Budget()).seconds
    shown.start(start + seconds if seconds else None)
    shown.stage("capture")
    prof, cap = _profile(loaded, stored, layout, blocks)
    if profile_out:
        prof.save(profile_out)
    run, budget = _started(store, stored, loaded, prof, pol, budget, load, cap.layout if cap else "", cap is None,
                           inductor)
    folder = _artifact_folder(store, run, runs_dir)
    pol.bind(store, run.id)  # where an LLM policy records its calls
    try:
        # before the workers: nothing else runs
        # a compilation ahead ends early enough for the chain with the found kernels after the search
        floor = _floor(loaded, cap, shown, start + budget.seconds * _COMPILE_END if budget.seconds else None
                       ) if inductor else None
        with evaluator_for(loaded.device, scale) as ev:
            searching = replace(budget, seconds=_search_seconds(budget.seconds, time.monotonic() - start, floor))
            log.info("the search starts at %.1f s of the run, for %.1f s", time.monotonic() - start, searching.seconds)
            outcomes = search(list(prof.tasks), pol, ev, StoreRecorder(store, run.id), searching, shown,
                              resume=bool(resume))
            _failed(store, run, pol)
            kernels = winners(outcomes, prof.tasks, ev)
            tuned_on = ev.device_model
        pol.close()  # before the end-to-end check loads the found kernels here: no LLM request after the search
        log.info("the search ended at %.1f s of the run", time.monotonic() - start)
        shown.stage("variants")
        report = _result(loaded, store, run, pol, kernels, cap, tuple(outcomes), budget, start, folder, inductor,
                         floor, tuned_on)
        shown.stage("done")
        return report
    except KeyboardInterrupt as e:  # in the search or the final timing: every candidate so far is stored
        store.update_run(run.id, state="stopped", note=f"interrupted: forge optimize --resume {run.id}")
        raise Interrupted(run.id) from e
    finally:
        pol.close()


def _failed(store: Store, run: RunRecord, pol: Policy) -> None:
    """RunFailed, stored with the run, when the policy says the run cannot go on (its key holder is gone)."""
    why = pol.failure()
    if why:
        store.update_run(run.id, state="failed", note=why)
        raise RunFailed(f"{why}: run {run.id} failed (what it evaluated is stored)")


def _profile(loaded: LoadedModel, stored: RunRecord | None, layout: str | None, blocks: bool
             ) -> tuple[Profile, Capture | None]:
    """The profile to search from and the whole capture (None when captured block-wise). A resumed run is
    captured as it was started: in its layout (its task keys name those strides), block-wise or whole."""
    if stored:
        layout, blocks = stored.config.get("layout", ""), bool(stored.config.get("blocks"))
    prof = profile_blockwise(loaded, budget_s=1.0) if blocks else None
    return (prof, None) if prof is not None else profile_model(loaded, budget_s=1.0, layout=layout)


def _started(store: Store, stored: RunRecord | None, loaded: LoadedModel, prof: Profile, pol: Policy,
             budget: Budget | None, load: dict[str, Any] | None, layout: str, blocks: bool, inductor: bool
             ) -> tuple[RunRecord, Budget]:
    """The run to search in and its budget: the stored one resumed (checked to be this model), or a new one."""
    if stored:
        _check_same_model(stored, loaded, {t.key for t in prof.tasks}, store.get_tasks(stored.id))
        store.update_run(stored.id, state="running", finished_at=None)
        return stored, Budget(**stored.config["budget"])
    budget = budget or Budget()
    run = store.create_run(loaded.name, device=loaded.device, dtype=loaded.dtype, policy=pol.name,
                           config={"budget": vars(budget), "load": load or {}, "layout": layout, "blocks": blocks,
                                   "mode": loaded.mode, "inductor": inductor})
    return run, budget


def _search_seconds(seconds: float, elapsed: float, floor: Ahead | None) -> float:
    """The search's wall time: to its share of the run's, and, when the floor was measured ahead, no later than
    leaves time before the last fraction for what follows it, judged by what the floor's stage took: the
    re-timing of the winners (a tenth of the run), the chain with the found kernels (as long as the one
    without them) and one more compilation (as long as the floor's). At least 5 s."""
    left = seconds * _SEARCH_SHARE - elapsed
    if floor is not None and floor.tried:
        left = min(left, seconds * (_COMPILE_END - 0.1) - elapsed - floor.chain_s - floor.compile_s)
    return max(5.0, left)


def _floor(loaded: LoadedModel, cap: Capture | None, shown: Progress, finish: float | None) -> Ahead | None:
    """The chain without kernels, torch.compile's result and that chain compiled, measured ahead of the search
    on a GPU (measure_floor), else none (on the CPU compilations take seconds: after the search, as before)."""
    if cap is None or not loaded.device.startswith("cuda"):
        return None
    shown.stage("compile")
    return measure_floor(loaded.model, loaded.inputs, loaded.device, cap, finish=finish)


def winners(outcomes: Sequence[TaskOutcome], tasks: Sequence[Task], ev: Evaluator) -> list[KernelArtifact]:
    """The winners the search named, built for the evaluator's device (from the build cache their evaluation
    filled) into the kernels a variant may dispatch; a winner that no longer builds is left out."""
    by_key = {t.key: t for t in tasks}
    out = []
    for o in outcomes:
        if o.best is None:
            continue
        path = build(o.best, ev.arch, ev.cache_dir).path
        t = by_key[o.key]
        if path:
            out.append(KernelArtifact(o.key, o.best.backend, path, o.best.entry, t.inputs, t.outputs, t.source,
                                      o.best.source))
    return out


def _result(loaded: LoadedModel, store: Store, run: RunRecord, pol: Policy, kernels: list[KernelArtifact],
            cap: Capture | None, outcomes: tuple[TaskOutcome, ...], budget: Budget, start: float, folder: Path,
            inductor: bool, floor: Ahead | None, tuned_on: str) -> OptimizeReport:
    """The searched kernels' variants measured end to end, the fastest saved as the run's artifact (eager's
    when none beats it), the run finished in the store, and the report."""
    layout = cap.layout if cap else ""
    info = {"run_id": run.id, "model": loaded.name, "device": loaded.device,
            "device_model": tuned_on, "dtype": loaded.dtype, "layout": layout,
            "mode": loaded.mode}
    deadline = start + budget.seconds * _COMPILE_BY if budget.seconds else None
    finish = start + budget.seconds * _COMPILE_END if budget.seconds else None
    if cap is None:  # captured block-wise: dispatched block-wise
        best, tried = choose_blockwise(loaded.model, loaded.inputs, kernels, loaded.device, compile=inductor,
                                       finish=finish)
    else:
        best, tried = choose(loaded.model, loaded.inputs, kernels, loaded.device, compile=inductor,
                             deadline=deadline, finish=finish, cap=cap, ahead=floor)
    # the found kernels with no rewrite (the first variant of their chain that ran), for the report
    plain = [m for m in tried if m.variant.kernels == bool(kernels) and not m.variant.rewrites
             and not m.variant.runtime.startswith("inductor")]
    first = next((m for m in plain if m.ok), plain[0] if plain else tried[0])
    graph = next((m for m in plain if m.variant.runtime == "cuda-graph"), None)
    applied = best.ok and best.variant != TRIVIAL and best.ms < best.eager_ms * GAIN
    eager_ms = next((m.eager_ms for m in (best, *tried) if m.eager_ms), 0.0) or _eager_ms(loaded)
    forge_ms = best.ms
    if applied:
        used = kernels if best.variant.kernels else []
        artifact.save(folder, used, {**info, "variant": best.variant.to_json(),
                                     "cuda_graph": best.variant.runtime == "cuda-graph"})
    else:  # never slower: the model you get is eager, and so is its time
        forge_ms = eager_ms
        why = (f"no variant was 1% faster than eager (best {best.variant.name}: {best.ms:.3f} ms against "
               f"{best.eager_ms:.3f})" if best.ok else f"every variant failed ({best.error or 'outputs differ'})")
        artifact.save(folder, [], {**info, "note": f"not applied: {why}"})
    # the model you get: the variant's outputs, or eager's own (every variant's are in report.variants)
    match, err = (best.match, best.max_rel_err) if applied else (True, 0.0)
    store.update_run(run.id, state="done", eager_ms=eager_ms, forge_ms=forge_ms)
    cost = store.run_cost(run.id)
    return OptimizeReport(run.id, loaded.device, pol.name, eager_ms, forge_ms, match, err, applied, first.ms,
                          applied and best.variant.runtime == "cuda-graph", graph.ms if graph and graph.ok else None,
                          graph.error if graph and "CUDA graph" in graph.error else "", outcomes,
                          str(folder), {"usd": cost.usd, "tokens_in": cost.tokens_in, "tokens_out": cost.tokens_out,
                                        "device_seconds": cost.device_seconds,
                                        "wall_seconds": time.monotonic() - start},
                          best.variant if applied else None, tuple(tried),
                          best.peak_mem_ratio if applied else None, layout, loaded.mode)
