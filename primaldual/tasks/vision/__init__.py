"""Task ``vision``: ViT / DeiT image classification (step-based, heldout protocol, the ``augment`` section).

The package: ``task`` registers the task (imported by name on first use, :func:`primaldual.tasks.get_task`); the
other modules are its data, model and training parts, imported by the task when it builds them.
"""

__all__ = ["VISION_IDX_DATASETS"]

# data.name values read from idx files; every other name is an image-folder tree under data.root
VISION_IDX_DATASETS: tuple[str, ...] = ("fashion_mnist", "mnist")
