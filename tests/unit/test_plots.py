import json

from bootstrap import plots


def test_plots_draw_every_process_and_skip_bad_lines(tmp_path):
    for node, task in (("node1", "worker-0"), ("node2", "worker-1")):
        folder = tmp_path / "hosts" / node
        folder.mkdir(parents=True)
        lines = [json.dumps({"step": s, "loss": 2.0 / s, "examples_per_sec": 100.0 + s}) for s in range(1, 6)]
        (folder / f"metrics.{task}.jsonl").write_text("\n".join([*lines, "not json", '{"no": "step"}']) + "\n")
    assert sorted(plots.read_metrics(tmp_path)) == ["worker-0 (node1)", "worker-1 (node2)"]
    assert len(plots.read_metrics(tmp_path)["worker-1 (node2)"]) == 5
    written = plots.draw(tmp_path)
    assert [p.name for p in written] == ["loss.png", "throughput.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_metrics_no_plots(tmp_path):
    assert plots.draw(tmp_path) == []
    assert not (tmp_path / "loss.png").exists()


def test_plots_draw_each_process_in_its_colour_and_only_the_charts_with_points(tmp_path):
    from PIL import Image

    folder = tmp_path / "hosts" / "node1"
    folder.mkdir(parents=True)
    (folder / "metrics.worker-0.jsonl").write_text("\n".join(json.dumps({"step": s, "loss": 1.0 / s})
                                                             for s in range(1, 50)) + "\n")
    written = plots.draw(tmp_path)
    assert [p.name for p in written] == ["loss.png"]  # no examples/s logged: no empty throughput chart
    image = Image.open(written[0]).convert("RGB")
    assert image.size == plots.SIZE
    first = tuple(int(plots.COLOURS[0][i:i + 2], 16) for i in (1, 3, 5))
    assert sum(1 for pixel in image.get_flattened_data() if pixel == first) > 100  # the line (and its legend stroke)
    second = tuple(int(plots.COLOURS[1][i:i + 2], 16) for i in (1, 3, 5))
    assert second not in set(image.get_flattened_data())  # one process, one colour


def test_ticks_are_round_steps_around_the_values():
    assert plots.ticks(0, 276) == [0, 50, 100, 150, 200, 250, 300]
    assert plots.ticks(0.05, 2.58) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert plots.ticks(846.3, 955.0) == [840, 860, 880, 900, 920, 940, 960]
    assert plots.ticks(0.0012, 0.0049) == [0.001, 0.002, 0.003, 0.004, 0.005]
    assert plots.ticks(1, 3, least_step=1.0) == [1, 2, 3]  # steps: no half steps
    for low, high in ((5, 5), (0, 0), (0.6931471805599453, 0.6931471805599454), (3e-13, 9e-13), (-2.0, -2.0)):
        found = plots.ticks(low, high)
        assert found[0] <= low <= high <= found[-1] and len(set(found)) == len(found) >= 2, (low, high, found)


def test_labels_carry_the_decimals_their_step_needs():
    assert plots.label(15000, 5000) == "15000"
    assert plots.label(0.25, 0.05) == "0.25"
    assert plots.label(2.0, 0.5) == "2.0"
    assert [plots.label(v, 2) for v in plots.ticks(12340, 12350)] == ["12340", "12342", "12344", "12346", "12348",
                                                                      "12350"]


def test_scale_maps_a_span_onto_pixels_either_way():
    assert plots.scale(5, (0, 10), (100, 200)) == 150
    assert plots.scale(0, (0, 10), (300, 40)) == 300  # y: the lowest value at the bottom
    assert plots.scale(10, (0, 10), (300, 40)) == 40
    assert plots.scale(3, (3, 3), (100, 200)) == 150


def test_lines_keep_finite_numeric_points_of_the_key_per_process():
    series = {"a": [{"step": 1, "loss": 2}, {"step": 2, "loss": None}, {"step": 3, "loss": "x"},
                    {"step": 4, "loss": float("nan")}, {"step": 5, "loss": float("inf")}, {"step": 6, "loss": True},
                    {"step": True, "loss": 1.0}],
              "b": [{"step": 1}]}
    assert plots.lines(series, "loss") == {"a": [(1.0, 2.0)]}


def test_a_run_that_diverged_is_drawn_from_its_finite_points(tmp_path):
    folder = tmp_path / "hosts" / "node1"
    folder.mkdir(parents=True)
    rows = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": float("inf")}, {"step": 3, "loss": float("nan")}]
    (folder / "metrics.worker-0.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    assert [p.name for p in plots.draw(tmp_path)] == ["loss.png"]
    (folder / "metrics.worker-0.jsonl").write_text(json.dumps({"step": 1, "loss": float("nan")}) + "\n")
    (tmp_path / "loss.png").unlink()
    assert plots.draw(tmp_path) == [] and not (tmp_path / "loss.png").exists()


def test_the_legend_goes_to_the_corner_over_the_fewest_points():
    area = (0, 0, 100, 100)
    assert plots.legend_corner((20, 10), area, []) == (72, 8)  # the top right where nothing is drawn
    crowded_top = [(x, y) for x in range(0, 100, 5) for y in range(0, 30, 5)]
    assert plots.legend_corner((20, 10), area, crowded_top) == (72, 82)  # the bottom right


def test_the_legend_names_eight_processes_at_most():
    assert plots.legend_rows(["a", "b"]) == ["a", "b"]
    many = [f"worker-{i}" for i in range(30)]
    rows = plots.legend_rows(many)
    assert len(rows) == plots.LEGEND_ROWS and rows[-1] == "and 23 more" and rows[:-1] == many[:7]
