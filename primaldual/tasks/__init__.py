"""Tasks as plugins: ``register_task`` and the :class:`Task` protocol (see :mod:`primaldual.tasks.base`).

Built in: ``uea`` (:mod:`.uea`), ``lra_listops`` / ``lra_text`` / ``lra_retrieval`` / ``lra_image`` /
``lra_pathfinder`` (:mod:`.lra`), ``lm`` (:mod:`.lm`), ``offline_rl`` (:mod:`.offline_rl`) and ``vision``
(:mod:`.vision`). Importing this package imports none of them; :func:`get_task` imports a built-in task on first
use.
"""

from .base import Task, get_task, list_tasks, register_task, unregister_task

__all__ = ["Task", "get_task", "list_tasks", "register_task", "unregister_task"]
