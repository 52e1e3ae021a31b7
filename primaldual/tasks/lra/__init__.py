"""The Long-Range Arena tasks ``lra_listops``, ``lra_text``, ``lra_retrieval``, ``lra_image``, ``lra_pathfinder``.

The package: ``task`` registers the task (imported by name on first use, :func:`primaldual.tasks.get_task`); the
other modules are its data, model and training parts, imported by the task when it builds them.
"""
