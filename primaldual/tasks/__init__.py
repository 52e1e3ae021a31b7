"""Tasks: the contract (:class:`Task`, ``register_task``, :func:`get_task`; :mod:`.base`, :mod:`.protocols`) and one
package per built-in task, each registered by its ``task`` module.

Built in: ``uea`` (:mod:`.uea`), ``lra_listops`` / ``lra_text`` / ``lra_retrieval`` / ``lra_image`` /
``lra_pathfinder`` (:mod:`.lra`), ``lm`` (:mod:`.lm`), ``offline_rl`` (:mod:`.offline_rl`) and ``vision``
(:mod:`.vision`); the classification tasks share :mod:`.classification`. Importing this package imports none of
them; :func:`get_task` imports a built-in task's ``task`` module by name on first use, as it loads a plugin's.
"""

from .base import Task, get_task, list_tasks, register_task, unregister_task

__all__ = ["Task", "get_task", "list_tasks", "register_task", "unregister_task"]
