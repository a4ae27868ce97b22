"""A simulated cluster for the real central actor: N virtual slots, evaluation times in virtual time.

Benchmark and test use (benchmarks/cluster_sim.py), never a run's default. `simulate` builds the real
`CentralActor` in this process and replaces only its Ray dispatch and its clock:

- `clock.py`: the virtual clock (real time while the actor computes, a jump while it waits);
- `watch.py`: whether the planner's two threads are at work (the clock may jump only when neither is);
- `cluster.py`: the virtual slots (a heap of completions) and the dispatcher that submits to them;
- `simulate.py`: one run, and its utilization as the report computes it.
"""

from __future__ import annotations

from orchestrator.sim.clock import VirtualClock
from orchestrator.sim.cluster import SimCluster, SimDispatcher
from orchestrator.sim.simulate import SimRun, simulate
from orchestrator.sim.watch import PlannerWatch

__all__ = ["PlannerWatch", "SimCluster", "SimDispatcher", "SimRun", "VirtualClock", "simulate"]
