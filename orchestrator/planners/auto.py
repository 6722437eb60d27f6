"""``auto``: run every applicable planner and keep the plan the simulator scores fastest.

Every registered literature and baseline planner (``even``, ``params``, ``pipedream``, ``spp``,
``dapple``, ``autopipe``, ``2bw``) is run on the same input; each plan that the planner could produce
is simulated and rejected if it exceeds device memory; the three fastest are additionally offered
with interleaved virtual chunks (:mod:`interleaving`). The fastest survivor wins and is labelled ``auto:<planner>``
(``auto:<planner>+v<k>`` when interleaving won). Because each single planner's own plan is among the
candidates and is scored by the same simulator, ``auto`` is never worse than any of them.

``options.extra["auto_planners"]`` (a list of names) restricts the candidates.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.cluster import Cluster
from orchestrator.errors import UserError
from orchestrator.plan import Plan
from orchestrator.planners.base import REGISTRY, PlannerOptions, PlannerSpec, get_planner, register
from orchestrator.planners.interleaving import best_interleaving
from orchestrator.profile import Profile
from orchestrator.simulator import memory_error, simulate

TOP_INTERLEAVE = 3
CANDIDATES = ("even", "params", "pipedream", "spp", "dapple", "autopipe", "2bw")


def plan_auto(profile: Profile, cluster: Cluster, options: PlannerOptions) -> Plan:
    names = list(options.extra.get("auto_planners", CANDIDATES))
    inner = replace(options, extra={k: v for k, v in options.extra.items() if k not in ("interleave", "auto_planners")})
    failures: list[str] = []
    scored: list[tuple[float, Plan, str]] = []
    for name in names:
        if name == "auto":
            continue
        try:
            plan = get_planner(name).fn(profile, cluster, inner)
        except UserError as exc:
            failures.append(f"{name}: {exc}")
            continue
        res = simulate(plan, profile, cluster, options.sim_options)
        if options.check_memory and memory_error(res, cluster):
            failures.append(f"{name}: plan exceeds device memory")
            continue
        scored.append((res.iteration_s, plan, name))
    scored.sort(key=lambda x: x[0])
    # Interleaving only helps a plan by shrinking its bubble, so it is offered to the leaders
    # (TOP_INTERLEAVE of them); each interleaved variant is simulated and memory-checked.
    for t, plan, name in list(scored[:TOP_INTERLEAVE]):
        cand = best_interleaving(plan, profile, cluster, inner)
        if cand is not plan:
            res = simulate(cand, profile, cluster, options.sim_options)
            if not (options.check_memory and memory_error(res, cluster)):
                scored.append((res.iteration_s, cand, f"{name}+v{cand.virtual_chunks}"))
    best = min(scored, key=lambda x: x[0]) if scored else None
    if best is None:
        detail = "; ".join(failures) or "every candidate plan exceeds device memory"
        raise UserError(f"auto: no planner produced a plan that fits ({detail})")
    t, plan, label = best
    return replace(plan, algorithm=f"auto:{label}", objective_s=t)


register(PlannerSpec("auto", plan_auto, "every planner (+ interleaving), fastest simulated plan that fits memory"))
assert "auto" in REGISTRY
