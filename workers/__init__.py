"""How one evaluation runs on the cluster: resources, timeout, retries, failures turned into records.

`workers` runs an objective and knows nothing of models (ARCHITECTURE.md); the central actor
(orchestrator/actor.py) submits one `submit_evaluation` task per trial and ingests its record.
"""

from workers.evaluate import FAILURE_REASONS, classify_value, evaluate_once, submit_evaluation, task_options

__all__ = ["FAILURE_REASONS", "classify_value", "evaluate_once", "submit_evaluation", "task_options"]
