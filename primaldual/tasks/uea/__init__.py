"""Task ``uea``: multivariate time-series classification on the UEA archive (epoch-based; heldout or paper protocol).

The package: ``task`` registers the task (imported by name on first use, :func:`primaldual.tasks.get_task`); the
other modules are its data, model and training parts, imported by the task when it builds them.
"""
