"""Task ``lm``: causal language modelling (step-based; the lowest validation loss selects the checkpoint).

The package: ``task`` registers the task (imported by name on first use, :func:`primaldual.tasks.get_task`); the
other modules are its data, model and training parts, imported by the task when it builds them.
"""
