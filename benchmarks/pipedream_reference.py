"""Pure-Python transcription of PipeDream's ``optimizer_graph_hierarchical.py`` DP (the reference).

msr-fiddle/pipedream, optimizer/optimizer_graph_hierarchical.py, ``compute_partitioning`` (MIT):
the same loops over i, j, m, k, m' on Python lists, specialised to a chain profile (the
predecessors of state j are all states before it). Settings as the published optimizer runs:
no memory constraint, ``use_fewer_machines``, not straight, and transfers counted (the original
counts them when an activation compression ratio is given; we pass 1.0). Used only by
``benchmarks/planners.py`` to time our vectorized planner against it side by side.
"""

from __future__ import annotations

from typing import Any

from orchestrator.profile import Profile

STRAIGHT = False
USE_FEWER_MACHINES = True
ACTIVATION_COMPRESSION_RATIO = 1.0


def compute_partitioning(compute_times: list[list[Any]], parameter_sizes: list[list[Any]], output_activation_sizes: list[float],
                         num_machines: int, num_machines_within_machine: int, bandwidth: float, final_level: bool = True) -> list[Any]:
    A: list[Any] = []
    for i in range(len(compute_times)):
        row_A = []
        for j in range(len(compute_times[0])):
            row_A.append([(None, None, None) for _ in range(num_machines)])
        A.append(row_A)
    for i in range(len(compute_times)):
        for j in range(i, len(compute_times[0])):
            cum_compute_time = compute_times[i][j]
            cum_parameter_size = parameter_sizes[i][j]
            max_m = 1 if STRAIGHT else num_machines
            for m in range(max_m):
                if cum_compute_time is None:
                    A[i][j][m] = (None, None, None)
                    continue
                dp_time = (4 * m * cum_parameter_size) / (bandwidth * (m + 1))
                dp_time /= num_machines_within_machine
                A[i][j][m] = (sum([cum_compute_time, dp_time]) / (m + 1), None, (m + 1))
    max_i = len(compute_times) if not final_level else 1
    for i in range(max_i):
        for m in range(1, num_machines):
            for j in range(i + 1, len(compute_times[0])):
                (min_pipeline_time, optimal_split, optimal_num_machines) = A[i][j][m]
                if USE_FEWER_MACHINES and m > 0 and (min_pipeline_time is None or (A[i][j][m - 1][0] is not None and A[i][j][m - 1][0] < min_pipeline_time)):
                    (min_pipeline_time, optimal_split, optimal_num_machines) = A[i][j][m - 1]
                for k in range(j):  # chain: every earlier state is a predecessor
                    if i > 0 and k < i - 1:
                        continue
                    max_m_prime = 2 if STRAIGHT else (m + 1)
                    for m_prime in range(1, max_m_prime):
                        input_transfer_time = (2.0 * output_activation_sizes[k]) / (bandwidth * m_prime)
                        output_transfer_time = None
                        if j < len(output_activation_sizes) - 1:
                            output_transfer_time = (2.0 * output_activation_sizes[j]) / (bandwidth * m_prime)
                        last_stage_time = compute_times[k + 1][j]
                        if last_stage_time is None:
                            continue
                        last_stage_parameter_size = parameter_sizes[k + 1][j]
                        last_stage_time = sum([last_stage_time, ((4 * (m_prime - 1) * last_stage_parameter_size) / (bandwidth * m_prime))])
                        last_stage_time /= m_prime
                        if A[i][k][m - m_prime][0] is None:
                            continue
                        pipeline_time = max(A[i][k][m - m_prime][0], last_stage_time)
                        input_transfer_time /= ACTIVATION_COMPRESSION_RATIO
                        pipeline_time = max(pipeline_time, input_transfer_time)
                        if output_transfer_time is not None:
                            output_transfer_time /= ACTIVATION_COMPRESSION_RATIO
                            pipeline_time = max(pipeline_time, output_transfer_time)
                        if min_pipeline_time is None or min_pipeline_time > pipeline_time:
                            optimal_split = (k, m - m_prime)
                            optimal_num_machines = m_prime
                            min_pipeline_time = pipeline_time
                A[i][j][m] = (min_pipeline_time, optimal_split, optimal_num_machines)
    return A


def tables(profile: Profile) -> tuple[list[list[Any]], list[list[Any]], list[float]]:
    """The optimizer's (L+1) x L range tables built from the chain's cumulative sums."""
    L = profile.num_blocks
    cum_c = [profile.compute_time(0, j + 1) for j in range(L)]
    cum_p = [profile.param_bytes(0, j + 1) for j in range(L)]
    ct: list[list[Any]] = []
    pt: list[list[Any]] = []
    for i in range(L + 1):
        if i == 0:
            ct.append(list(cum_c))
            pt.append(list(cum_p))
        else:
            ct.append([cum_c[j] - cum_c[i - 1] if j > i - 1 else None for j in range(L)])
            pt.append([cum_p[j] - cum_p[i - 1] if j > i - 1 else None for j in range(L)])
    return ct, pt, [float(a) for a in profile.activations]


def solve(profile: Profile, levels: list[tuple[int, float]]) -> float:
    """Run the hierarchical optimizer; ``levels`` = [(machines, bandwidth bytes/s), ...] inner first.
    Returns the optimum pipeline time (the bottleneck) at the top level."""
    ct, pt, acts = tables(profile)
    within = 1
    A: list[Any] = []
    for n, (machines, bw) in enumerate(levels):
        A = compute_partitioning(ct, pt, acts, machines, within, bw, final_level=(n == len(levels) - 1))
        within = machines
        for i in range(len(ct)):
            for j in range(len(ct[0])):
                ct[i][j] = A[i][j][-1][0]
    return float(A[0][profile.num_blocks - 1][-1][0])
