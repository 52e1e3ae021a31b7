"""Recipes: code that *builds* a dataset from something else and writes it in a format :mod:`primaldual.data` reads.

* :mod:`primaldual.recipes.english`: the English LM corpus from three Debian packages
  (``primaldual data fetch english``), with one module per source (:mod:`~primaldual.recipes.english.kernel_doc`,
  :mod:`~primaldual.recipes.english.austen`, :mod:`~primaldual.recipes.english.kjv`) and the ``.deb`` reading
  (:mod:`~primaldual.recipes.english.deb`); read by :mod:`primaldual.data.lm`.
* :mod:`primaldual.recipes.d4rl`: offline RL data by the D4RL recipe (SAC with stable-baselines3,
  ``primaldual data generate d4rl``); read by :mod:`primaldual.data.d4rl`.
* :mod:`primaldual.recipes.listops`, :mod:`primaldual.recipes.pathfinder`: the synthetic LRA tasks
  (``primaldual data generate listops|pathfinder``); read by :mod:`primaldual.data.listops` and
  :mod:`primaldual.data.pathfinder`.

Recipes import readers' format constants from :mod:`primaldual.data`, never the other way round. Each module is
imported by its full path, so importing this package costs nothing. The generator identifiers recorded in
``metadata.json`` (``"primaldual.data.listops v1"``, ...) keep the names of the modules that first wrote them, so
data generated before the move stays valid.
"""
