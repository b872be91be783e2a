"""The review data as JSON-ready dicts: the run list, a task's tree and a node in full (the web app's /api/
routes and the --json of forge runs, tree and show; the report's own is forge.review.report.report_json)."""

from __future__ import annotations

from typing import Any

from forge.review.data import NodeDetail, RunSummary, TaskView


def runs_json(summaries: list[RunSummary]) -> list[dict[str, Any]]:
    """One entry per run: what forge runs shows, with every number whole."""
    return [{"id": s.run.id, "model": s.run.model, "device": s.run.device, "dtype": s.run.dtype,
             "policy": s.run.policy, "state": s.run.state, "created_at": s.run.created_at.isoformat(),
             "eager_ms": s.run.eager_ms, "forge_ms": s.run.forge_ms, "speedup": s.speedup, "wall_seconds": s.wall_s,
             "usd": s.cost.usd, "device_seconds": s.cost.device_seconds} for s in summaries]


def tree_json(t: TaskView, run_state: str) -> dict[str, Any]:
    """A task's tree for the page script: one entry per node, parents first."""
    nodes = [{"id": n.cand.id, "parent_id": n.cand.parent_id, "depth": n.depth, "status": n.status,
              "baseline": n.baseline, "failed": n.failed, "best": n.best, "speedup": n.speedup,
              "speedup_ci": list(n.speedup_ci) if n.speedup_ci else None, "noisy": n.noisy, "visits": n.visits,
              "knobs": n.knobs_text(), "reason": n.reason, "origin": n.cand.origin} for n in t.nodes]
    version = f"{run_state}:{t.task.state}:{len(nodes)}:{t.tried}"
    return {"task": {"id": t.task.id, "key": t.task.key, "family": t.task.family, "state": t.task.state,
                     "stop_reason": t.task.stop_reason, "speedup": t.speedup, "tried": t.tried, "failed": t.failed,
                     "best_node": t.best_id, "speedup_ci": list(t.speedup_ci) if t.speedup_ci else None,
                     "noisy": t.noisy, "verdict": t.verdict},
            "run_state": run_state, "version": version, "nodes": nodes}


def node_json(d: NodeDetail) -> dict[str, Any]:
    """A node in full, as JSON."""
    n = d.node
    return {"id": n.id, "task_id": n.task_id, "task": d.task.key, "run_id": d.run.id, "parent_id": n.parent_id,
            "backend": n.backend, "entry": n.entry, "origin": n.origin, "status": n.status, "knobs": n.knobs,
            "visits": n.visits, "reward": n.reward, "source": n.source, "diff": d.diff(),
            "evaluations": [{"id": e.id, "status": e.status, "message": e.message, "build_log": e.build_log,
                             "verify": e.verify, "time_us_median": e.time_us_median,
                             "time_us_spread": e.time_us_spread, "baseline_us_median": e.baseline_us_median,
                             "speedup": e.speedup, "device": e.device, "device_seconds": e.device_seconds}
                            for e in d.evaluations],
            "llm_calls": [{"id": c.id, "provider": c.provider, "model": c.model, "status": c.status,
                           "prompt": c.prompt, "response": c.response, "tokens_in": c.tokens_in,
                           "tokens_out": c.tokens_out, "usd": c.usd, "latency_s": c.latency_s} for c in d.llm_calls]}
