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
