"""The Numba kernel against the plain-Python oracle, and the engine's own guarantees."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.sim.kernel import simulate
from harness.base.errors import HarnessError
from harness.sim.task_graph import CATEGORIES, CATEGORY, TASK_DTYPE, TaskGraph, csr_from_edges
from oracle import simulate_reference


def make_graph(lanes, pools, units, durations, deps, capacity, releases=None) -> TaskGraph:
    n = len(lanes)
    tasks = np.zeros(n, dtype=TASK_DTYPE)
    tasks["release_us"] = releases if releases is not None else 0.0
    tasks["lane"] = lanes
    tasks["pool"] = pools
    tasks["units"] = units
    tasks["duration_us"] = durations
    src = np.array([p for i in range(n) for p in deps[i]], dtype=np.int64)
    dst = np.array([i for i in range(n) for _ in deps[i]], dtype=np.int64)
    ptr, idx = csr_from_edges(n, src, dst)
    n_lanes = max(lanes) + 1
    return TaskGraph(
        tasks, ptr, idx, [f"lane{i}" for i in range(n_lanes)], np.zeros(n_lanes, np.int8),
        [f"pool{i}" for i in range(len(capacity))], np.array(capacity, dtype=np.int64),
    )


@st.composite
def random_graphs(draw):
    n = draw(st.integers(1, 40))
    n_lanes = draw(st.integers(1, 4))
    capacity = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    lanes, pools, units, durations, deps, releases = [], [], [], [], [], []
    with_releases = draw(st.booleans())
    for i in range(n):
        releases.append(draw(st.sampled_from([0.0, 0.0, 1.0, 2.5, 6.0])) if with_releases else 0.0)
        lanes.append(draw(st.integers(0, n_lanes - 1)))
        pool = draw(st.integers(-1, len(capacity) - 1))
        pools.append(pool)
        units.append(draw(st.integers(1, capacity[pool])) if pool >= 0 else 0)
        # Durations on a coarse grid (zero included) so that equal times, the hard case, are common.
        durations.append(draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])))
        deps.append(sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3)))) if i else [])
    return lanes, pools, units, durations, deps, capacity, releases


@settings(max_examples=300, deadline=None)
@given(random_graphs())
def test_kernel_agrees_exactly_with_python_oracle(case):
    lanes, pools, units, durations, deps, capacity, releases = case
    result = simulate(make_graph(*case))
    start, end, decider = simulate_reference(lanes, pools, units, durations, deps, capacity, releases)
    assert result.start_us.tolist() == start
    assert result.end_us.tolist() == end
    assert result.decider.tolist() == decider


@settings(max_examples=100, deadline=None)
@given(random_graphs())
def test_critical_path_is_contiguous_and_spans_the_run(case):
    result = simulate(make_graph(*case))
    path = result.critical_path()[::-1]
    # The path starts at t = 0 or at a task held only by its release time.
    assert result.start_us[path[0]] == max(case[6][path[0]], 0.0) or result.start_us[path[0]] == 0.0
    # Each task on the path starts exactly when its decider ended: no gaps, so durations add up.
    assert np.array_equal(result.start_us[path[1:]], result.end_us[path[:-1]])
    assert result.end_us[path[-1]] == result.makespan_us


def test_pool_capacity_serialises_tasks_on_different_lanes():
    # Two lanes, one core: the second task must wait for the first to release the core.
    result = simulate(make_graph([0, 1], [0, 0], [1, 1], [2.0, 3.0], [[], []], [1]))
    assert result.start_us.tolist() == [0.0, 2.0]
    assert result.decider.tolist() == [-1, 0]
    # With two cores both run at once.
    result = simulate(make_graph([0, 1], [0, 0], [1, 1], [2.0, 3.0], [[], []], [2]))
    assert result.start_us.tolist() == [0.0, 0.0]


def test_pool_is_fifo_in_readiness_order():
    # Task 1 needs 2 units and waits; task 2 (ready later, needs 1) must not overtake it.
    g = make_graph([0, 1, 2, 2], [0, 0, -1, 0], [1, 2, 0, 1], [4.0, 1.0, 1.0, 1.0], [[], [], [], [2]], [2])
    result = simulate(g)
    assert result.start_us.tolist() == [0.0, 4.0, 0.0, 5.0]


def test_same_graph_gives_identical_results():
    rng = np.random.default_rng(7)
    n = 2000
    lanes = rng.integers(0, 5, n).tolist()
    deps = [sorted(set(rng.integers(0, i, 2).tolist())) if i else [] for i in range(n)]
    pools = rng.integers(-1, 2, n).tolist()
    case = (lanes, pools, [1 if p >= 0 else 0 for p in pools], rng.integers(0, 3, n).astype(float).tolist(), deps, [2, 3])
    a, b = simulate(make_graph(*case)), simulate(make_graph(*case))
    assert np.array_equal(a.start_us, b.start_us) and np.array_equal(a.decider, b.decider)


def test_release_time_delays_a_task_and_cuts_the_critical_path():
    # Task 1 waits for task 0 (ends at 2) but is released only at 5.
    result = simulate(make_graph([0, 0], [-1, -1], [0, 0], [2.0, 1.0], [[], []], [1], releases=[0.0, 5.0]))
    assert result.start_us.tolist() == [0.0, 5.0]
    assert result.decider.tolist() == [-1, -1]
    assert result.critical_path().tolist() == [1]


def test_forward_dependency_is_rejected():
    g = make_graph([0, 1], [-1, -1], [0, 0], [1.0, 1.0], [[], []], [1])
    g.dep_ptr = np.array([0, 1, 1])
    g.dep_idx = np.array([1])  # task 0 depends on task 1: not topologically numbered
    with pytest.raises(HarnessError, match="lower task id"):
        simulate(g)


def test_task_larger_than_its_pool_is_rejected():
    with pytest.raises(HarnessError, match="needs 3 units"):
        simulate(make_graph([0], [0], [3], [1.0], [[]], [2]))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("lane", 5, "lane out of range"),
        ("lane", 2, "lane out of range"),  # exactly the number of lanes (0 and 1)
        ("lane", -1, "lane out of range"),
        ("pool", 3, "pool out of range"),
        ("duration_us", -1.0, "durations must be finite"),
        ("duration_us", np.nan, "durations must be finite"),
        ("duration_us", np.inf, "durations must be finite"),
        ("release_us", -2.0, "release times must be finite"),
        ("release_us", np.nan, "release times must be finite"),
        ("release_us", np.inf, "release times must be finite"),
        ("release_us", -0.5, "release times must be finite"),  # just below 0: a bound of -1 would let it through
    ],
)
def test_invalid_task_field_is_rejected(field, value, message):
    g = make_graph([0, 0, 1], [-1, 0, -1], [0, 1, 0], [1.0, 1.0, 1.0], [[], [0], [1]], [2])
    g.tasks[field][2] = value  # the last task: the check must look at every record
    with pytest.raises(HarnessError, match=message):
        simulate(g)


def test_many_lanes_all_pending_at_once():
    # Every lane's task is ready at t=0 and ends at the same time: the event heap holds one event per
    # lane at its fullest (its fixed capacity), and the pool queue orders the starts.
    n_lanes = 300
    lanes = list(range(n_lanes)) * 2
    case = (lanes, [0] * len(lanes), [1] * len(lanes), [1.0] * len(lanes), [[] for _ in lanes], [7])
    result = simulate(make_graph(*case))
    start, end, decider = simulate_reference(*case, [0.0] * len(lanes))
    assert result.start_us.tolist() == start and result.end_us.tolist() == end and result.decider.tolist() == decider


# Hand-made cases for what random graphs rarely produce.


def test_a_waiting_task_keeps_its_place_at_the_head_of_the_pool_queue():
    """Task 0 is held by its release time until 1 and then needs both units of the pool, one of which
    task 1 holds until 4: it waits at the head of the queue. Task 2 (ready at 2, needs 1 unit, which is
    free) must not overtake it: it starts when task 0 ends (4 + 2 = 6). Task 3 (ready at 3, 2 units)
    queues behind both."""
    g = make_graph([0, 1, 2, 3], [0, 0, 0, 0], [2, 1, 1, 2], [2.0, 4.0, 1.0, 1.0], [[], [], [], []], [2], releases=[1.0, 0.0, 2.0, 3.0])
    result = simulate(g)
    assert result.start_us.tolist() == [4.0, 0.0, 6.0, 7.0]
    assert result.decider.tolist() == [1, -1, 0, 2]
    start, end, decider = simulate_reference([0, 1, 2, 3], [0, 0, 0, 0], [2, 1, 1, 2], [2.0, 4.0, 1.0, 1.0], [[], [], [], []], [2],
                                             [1.0, 0.0, 2.0, 3.0])
    assert result.start_us.tolist() == start and result.decider.tolist() == decider


def test_the_path_of_each_step_covers_its_latency():
    """Each step's critical path, followed from its last task back to its first, adds up to its latency:
    the per-step breakdown rows sum to the step times (a chunk that starts at a later step included)."""
    from conftest import compose_run
    from harness.sim.lowering import Lowering
    from harness.sim.metrics import step_bounds
    from harness.sim.policies import prepare

    run = compose_run("workload=qwen3_30b_decode", "strategy=acl_graph", "workload.steps=5")
    workload, plan = prepare(run, np.full(5, run.workload.batch_size), None)
    lowering = Lowering(workload, run.hardware, run.strategy, run.seed, plan, run.engine)
    for steps in (np.arange(5), np.arange(2, 5)):
        result = simulate(lowering.graph(steps))
        on_path, all_tasks = result.step_category_us()
        start, end = step_bounds(result)
        assert on_path.shape[0] == steps.size
        assert on_path.sum(axis=1) == pytest.approx(end - start, rel=1e-12)
        work = result.end_us - result.work_start_us  # all tasks' time is their work: a kernel's front-end gap is idle
        assert (result.work_start_us > result.start_us).any()  # the graph's tasks each pay a dispatch
        assert all_tasks.sum(axis=1) == pytest.approx([work[result.graph.tasks["step"] == s].sum() for s in steps], rel=1e-12)


def test_an_empty_graph_and_a_negative_dependency_are_refused():
    empty = make_graph([0], [-1], [0], [1.0], [[]], [1])
    empty.tasks, empty.dep_ptr = empty.tasks[:0], np.zeros(1, dtype=np.int64)
    with pytest.raises(HarnessError, match="empty"):
        simulate(empty)
    g = make_graph([0, 0], [-1, -1], [0, 0], [1.0, 1.0], [[], []], [1])
    g.dep_ptr = np.array([0, 0, 1])
    g.dep_idx = np.array([-1])
    with pytest.raises(HarnessError, match="lower task id"):
        simulate(g)


def test_a_pool_index_equal_to_the_number_of_pools_is_refused():
    g = make_graph([0, 0], [-1, 0], [0, 1], [1.0, 1.0], [[], []], [2])
    g.tasks["pool"][1] = 1  # pools are 0 .. 0
    with pytest.raises(HarnessError, match="pool out of range"):
        simulate(g)


def test_the_critical_path_starts_from_the_last_task_to_end_highest_id_on_ties():
    """Two lanes end together at 2: the path is followed back from the later task id, whose category the
    step's breakdown then holds."""
    g = make_graph([0, 1], [-1, -1], [0, 0], [2.0, 2.0], [[], []], [1])
    g.tasks["category"] = [0, 7]
    result = simulate(g)
    assert result.critical_path().tolist() == [1]
    on_path, all_tasks = result.step_category_us()
    assert on_path[0].tolist() == [0.0] * 7 + [2.0] + [0.0] * (len(CATEGORIES) - 8) and all_tasks[0, [0, 7]].tolist() == [2.0, 2.0]


def test_a_tasks_lead_on_the_critical_path_is_front_end_time():
    """One lane, two tasks of 2 µs, the second with a 0.5 µs lead (its front-end gap): the path holds
    both whole (4.5 µs), the lead in the front-end category, the work in each task's own."""
    g = make_graph([0, 0], [-1, -1], [0, 0], [2.0, 2.5], [[], []], [1])
    g.tasks["category"] = [0, 7]
    g.tasks["lead_us"] = [0.0, 0.5]
    on_path, all_tasks = simulate(g).step_category_us()
    front_end = CATEGORY["front_end"]
    assert on_path[0, [0, 7, front_end]].tolist() == [2.0, 2.0, 0.5] and on_path[0].sum() == 4.5
    assert all_tasks[0, [0, 7, front_end]].tolist() == [2.0, 2.0, 0.0]


def test_a_task_that_becomes_head_of_the_queue_keeps_its_place_for_those_behind():
    """Pool of 2. Task 1 holds both units 0-4; task 2 (ready at 1, 1 unit) and task 0 (ready at 2, 2 units)
    wait in that order. At 4 task 2 starts and task 0, now first in line, cannot (1 unit free); task 3,
    ready at 5 with 1 unit, must queue behind it. At 7 task 0 starts, at 8 task 3."""
    case = ([0, 1, 2, 3], [0, 0, 0, 0], [2, 2, 1, 1], [1.0, 4.0, 3.0, 1.0], [[], [], [], []], [2])
    result = simulate(make_graph(*case, releases=[2.0, 0.0, 1.0, 5.0]))
    assert result.start_us.tolist() == [7.0, 0.0, 4.0, 8.0]
    assert result.decider.tolist() == [2, -1, 1, 0]
    start, _, decider = simulate_reference(*case, [2.0, 0.0, 1.0, 5.0])
    assert result.start_us.tolist() == start and result.decider.tolist() == decider


def test_a_lanes_first_task_waits_for_its_dependencies_whatever_ends_before():
    """Task 2 opens lane 2 but depends on task 0 (0-10); task 3 (lane 1, after task 1) ends at 2 first:
    task 2 must still wait until 10."""
    case = ([0, 1, 2, 1], [-1] * 4, [0] * 4, [10.0, 1.0, 1.0, 1.0], [[], [], [0], []], [1])
    result = simulate(make_graph(*case))
    assert result.start_us.tolist() == [0.0, 0.0, 10.0, 1.0]
    assert result.start_us.tolist() == simulate_reference(*case, [0.0] * 4)[0]


def test_a_task_depending_on_itself_is_refused():
    g = make_graph([0, 0], [-1, -1], [0, 0], [1.0, 1.0], [[], []], [1])
    g.dep_ptr = np.array([0, 0, 1])
    g.dep_idx = np.array([1])  # task 1 waits for task 1
    with pytest.raises(HarnessError, match="lower task id"):
        simulate(g)
