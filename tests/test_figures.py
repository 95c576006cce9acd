"""Figures a run writes: ``results.png``'s title names the sampling that ran, and ``seeds.png``'s
legend covers no curve and fits in the figure."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedjax_dp.training import plots
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.reporting import run_title


@pytest.mark.parametrize(
    "method, expected",
    [
        ("min_separation", "m=10, b=4 min-separation, check-in 0.5,"),
        ("single", "m=10, single participation, check-in 0.5,"),
        ("cyclic", "cyclic, 4 groups,"),
        ("cyclic_poisson", "cyclic Poisson, 4 groups, q=0.2,"),
        ("poisson", "Poisson q=0.2,"),
        ("uniform", "m=10,"),
    ],
)
def test_the_run_title_names_the_sampling_that_ran(method, expected):
    """A min-separation run's results.png said 'Poisson q=0.2'."""
    c = default_config()
    c.sampling.update(method=method, rate=0.2, min_separation=4, check_in_rate=0.5)
    title = run_title(c, "mnist_5k", 100)
    assert f"K=100, {expected} E=" in title
    assert ("Poisson" in title) == (method in ("poisson", "cyclic_poisson"))


@pytest.mark.parametrize("panels", [1, 3])
def test_the_seeds_legend_covers_no_panel_and_fits_in_the_figure(tmp_path, monkeypatch, panels):
    """The legend sat inside each panel over the curves, and its band label ran past the edge."""
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    x = np.arange(1, 11)
    curves = {
        name: (x, x / 20, x / 20 - 0.3, x / 20 + 0.3)
        for name in ("test_accuracy", "test_loss", "epsilon")[:panels]
    }
    plots.plot_seeds(curves, str(tmp_path / "seeds.png"), "a title", seeds=2)
    (fig,) = figures
    FigureCanvasAgg(fig).draw()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends
    for legend in legends:
        box = legend.get_window_extent()
        assert not any(box.overlaps(ax.bbox) for ax in fig.axes)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
