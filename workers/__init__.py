"""How one evaluation runs on the cluster: resources, timeout, retries, failures turned into records.

`workers` runs an objective and knows nothing of models (ARCHITECTURE.md); the central actor
(orchestrator/actor.py) has one `submit_evaluation` task submitted per trial, by its `EvaluationPool` actor
(workers/pool.py; by itself without a pool), and ingests its `TrialResult`.
"""

from workers.evaluate import evaluate_once, submit_evaluation, task_options
from workers.records import FAILURE_REASONS, TrialResult, classify_value

__all__ = ["FAILURE_REASONS", "TrialResult", "classify_value", "evaluate_once", "submit_evaluation",
           "task_options"]
