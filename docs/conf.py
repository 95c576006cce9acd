"""Sphinx configuration of the fedjax_dp documentation.

Sphinx with MyST-NB, as optax and flax build theirs: pages are Markdown (MyST), the notebooks in
``colabs/`` are rendered with the outputs they were saved with (never executed here), and the API
reference is generated from the docstrings of each subpackage's ``__all__``. The build needs no
network (no intersphinx) and the suite runs it with warnings as errors (``tests/test_docs.py``):

    python3 -m pip install -e ".[docs]" && python3 -m sphinx -W --keep-going -b html docs
    docs/_build/html
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("FEDJAX_DP_CPU_DEVICES", "1")

import fedjax_dp  # noqa: E402

project = "fedjax_dp"
author = "the fedjax_dp authors"
copyright = "2026, the fedjax_dp authors"
release = version = fedjax_dp.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 4
# the notebooks' saved outputs (the suite runs them itself, tests/test_colabs.py)
nb_execution_mode = "off"
nb_merge_streams = True

autosummary_generate = True
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# signatures as written; resolving every annotation would need intersphinx
autodoc_typehints = "none"
# a default as the source writes it (``rdp_orders=RDP_ORDERS``), not its value (158 RDP orders)
autodoc_preserve_defaults = True
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # dataclass fields once, not again as attribute directives
suppress_warnings = ["myst.header"]

html_theme = "sphinx_book_theme"
html_title = f"fedjax_dp {release}"
html_theme_options = {"show_toc_level": 2}


def _results_links(app, relative_path, parent_docname, content):
    """The scorecard (``experiments/README.md``) links into ``RESULTS.md`` beside it; included here,
    that notebook is the ``results`` page."""
    if str(relative_path).endswith("experiments/README.md"):
        content[0] = (
            content[0]
            .replace("](RESULTS.md#", "](results.md#")
            .replace("](RESULTS.md)", "](results.md)")
        )


def setup(app):
    app.connect("include-read", _results_links)
