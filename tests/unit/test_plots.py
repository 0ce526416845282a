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
    single = plots.ticks(5, 5)
    assert single[0] < 5 < single[-1]
    assert plots.ticks(0, 0)[0] < 0 < plots.ticks(0, 0)[-1]


def test_scale_maps_a_span_onto_pixels_either_way():
    assert plots.scale(5, (0, 10), (100, 200)) == 150
    assert plots.scale(0, (0, 10), (300, 40)) == 300  # y: the lowest value at the bottom
    assert plots.scale(10, (0, 10), (300, 40)) == 40


def test_lines_keep_numeric_points_of_the_key_per_process():
    series = {"a": [{"step": 1, "loss": 2}, {"step": 2, "loss": None}, {"step": 3, "loss": "x"}],
              "b": [{"step": 1}]}
    assert plots.lines(series, "loss") == {"a": [(1.0, 2.0)]}
