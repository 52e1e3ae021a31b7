"""``import primaldual`` makes exported models loadable by transformers' Auto classes, without importing transformers.

A directory written by ``primaldual export RUN --format hf`` has ``model_type: primaldual_lm``, which transformers
knows only once :mod:`primaldual.integrations.hf` has registered it. ``import primaldual`` must stay free of
transformers (its import takes seconds and the core is torch-only), so :func:`install` registers at once when
transformers is already imported, and otherwise leaves a one-shot import hook that registers right after
transformers' own import finishes. A failure there is never an error in the user's ``import transformers``: an
``ImportError`` (a transformers release outside the ``hf`` extra's range) is silent, anything else a warning. Written by hand: the standard library has no post-import hook.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["install"]


def _register() -> None:
    try:
        import primaldual.integrations.hf  # noqa: F401  (its import registers the Auto classes)
    except ImportError:
        # a transformers release outside the hf extra's range (or a missing dependency of the integration): the
        # user may not use our HF side at all, so no warning here; `import primaldual.integrations.hf` says why
        return
    except Exception as e:  # noqa: BLE001  (the user's import of transformers must not fail because of ours)
        warnings.warn(
            f"primaldual: exported models are not registered with transformers' Auto classes ({type(e).__name__}: "
            f"{e}); `import primaldual.integrations.hf` shows the error",
            stacklevel=3,
        )


class _AfterTransformers(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``transformers`` it returns the spec the other finders give, with the loader's
    ``exec_module`` wrapped to call :func:`_register` after the module ran; then it removes itself."""

    def find_spec(self, name: str, path: object = None, target: ModuleType | None = None):
        if name != "transformers":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot, and no recursion through the find_spec below
        spec = importlib.util.find_spec(name)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _register()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Register now if transformers is imported, else once it is (idempotent)."""
    if "transformers" in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterTransformers) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformers())
