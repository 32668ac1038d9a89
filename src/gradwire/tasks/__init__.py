"""Training tasks (data + model + objective) and data partitions, both built from spec strings.

    task = build_task("mnist1d-cnn", num_workers=8, seed=0)
    parts = build_partition("dirichlet:alpha=0.5", labels=task.y_train, num_workers=8, seed=0)

``TASKS.describe()`` and ``PARTITIONS.describe()`` list the choices and their parameters.
"""

from gradwire.tasks import datasets, language, synthetic  # noqa: F401  (registers the tasks)
from gradwire.tasks.base import TASKS, Task, TaskContext, build_task, check_task
from gradwire.tasks.partition import PARTITIONS, build_partition

__all__ = ["PARTITIONS", "TASKS", "Task", "TaskContext", "build_partition", "build_task", "check_task"]
