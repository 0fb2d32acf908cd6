"""pyqtgraph paints under our PySide6 pin (6.12.0 aborted on the first paint)."""

import pyqtgraph as pg


def test_plot_widget_paints(qtbot):
    plot = pg.PlotWidget(title="tokens/s")
    qtbot.addWidget(plot)
    plot.plot([0, 1, 2, 3], [10.0, 42.0, 38.5, 40.1], pen="c")
    plot.resize(320, 200)
    plot.show()
    qtbot.waitExposed(plot)
    image = plot.grab().toImage()
    assert not image.isNull() and image.width() > 0
    assert len({image.pixel(x, y) for x in range(0, image.width(), 7)
                for y in range(0, image.height(), 7)}) > 2  # something was drawn
