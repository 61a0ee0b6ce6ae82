"""The course's code: what several chapters share (models, data, training, checkpoint,
netns, the timeline plot, units, parameter helpers) and one subpackage per notebook,
``chNN_topic``, holding that chapter's demos and its ``plots.py``.

A chapter imports from these commons and from the launcher, never from another chapter.
Importing any of it inside a Jupyter kernel registers a display for matplotlib's bare
``Figure`` (what every ``plots.py`` returns), without importing matplotlib in the ranks.
"""

import sys


def _show_figures_in_notebooks() -> None:
    """A Figure made without pyplot has no notebook display of its own unless the inline
    backend happens to be active; register one by name so matplotlib is imported only when
    a figure is actually shown."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    if shell is None:
        return
    png = shell.display_formatter.formatters["image/png"]
    png.for_type_by_name("matplotlib.figure", "Figure", _figure_png)


def _figure_png(fig) -> bytes:
    from IPython.core.pylabtools import print_figure
    return print_figure(fig, "png", bbox_inches="tight")


_show_figures_in_notebooks()
