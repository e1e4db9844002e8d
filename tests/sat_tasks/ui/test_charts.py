"""The view's charts share one scale: data corners land on the plot box's corners, flat data still lays out."""

from __future__ import annotations

from sat_tasks.ui.compare import Series, loss_chart
from sat_tasks.ui.pages import Scale, line_chart

BOX = (60, 24, 704, 200)


def test_the_data_corners_land_on_the_plot_box_corners():
    scale = Scale.fit([10.0, 30.0], [0.5, 2.5], BOX)
    assert (scale.x(10), scale.y(0)) == ("60.0", "200.0")  # the y axis starts at zero
    assert (scale.x(30), scale.y(2.5)) == ("704.0", "24.0")
    assert scale.polyline([(20, 1.25)]) == "382.0,112.0"
    assert scale.ends() == {"x_from": "10", "x_to": "30", "y_from": "0", "y_to": "2.5"}


def test_one_point_or_a_flat_curve_still_lays_out():
    scale = Scale.fit([5.0], [0.0], BOX)
    assert scale.ends() == {"x_from": "5", "x_to": "6", "y_from": "0", "y_to": "1"}
    assert scale.x(5) == "60.0" and scale.y(0) == "200.0"
    assert Scale.fit([1.0, 2.0], [-1.0, -1.0], BOX).ends()["y_from"] == "-1"


def test_a_marker_past_the_last_point_widens_the_x_axis():
    chart = line_chart([(0, 2.0), (10, 1.0)], [(20, "attempt 2")], title="t", x_label="step", y_label="loss",
                       chart_id="c")
    assert chart.x_to == "20" and chart.marks == (("704.0", "attempt 2"),)
    assert chart.path.split()[-1] == "382.0,112.0"  # step 10 is half way; loss 1.0 half of 2.0
    assert line_chart([], [], title="t", x_label="x", y_label="y", chart_id="c").path == ""


def test_compared_runs_share_the_axes():
    chart = loss_chart([Series("a", "#000", "/a", [(0, 4.0), (10, 2.0)]), Series("b", "#111", "/b", [(0, 3.0), (20, 1.0)])])
    assert (chart.x_to, chart.y_to) == ("20", "4")
    assert [line[2] for line in chart.lines] == ["a", "b"]
    assert chart.lines[1][1].split()[-1] == f"704.0,{240 - 1 / 4 * 216:.1f}"
