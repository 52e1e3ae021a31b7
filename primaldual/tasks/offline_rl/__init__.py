"""Task ``offline_rl``: a (Primal.+) Decision Transformer on D4RL-layout data, evaluated by MuJoCo rollouts.

The package: ``task`` registers the task (imported by name on first use, :func:`primaldual.tasks.get_task`); the
other modules are its data, model and training parts, imported by the task when it builds them.
"""
