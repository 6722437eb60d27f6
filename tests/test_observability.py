"""Event log durability and redaction; plots render."""

from __future__ import annotations

from pathlib import Path

from orchestrator.elastic.observability import EventLog, plot_prices, plot_throughput, redact


def test_event_log_appends_and_redacts(tmp_path: Path) -> None:
    ticks = iter([10.0, 11.5])
    log = EventLog(tmp_path / "events.jsonl", clock=lambda: next(ticks))
    log.emit("start", plan={"stages": 4})
    log.emit("migrate", target="aws/us-east-1", credentials={"aws_secret_access_key": "AKIAXXXX"}, api_token="t0k")
    records = log.read()
    assert [r["event"] for r in records] == ["start", "migrate"]
    assert records[1]["time"] == 11.5 and records[1]["target"] == "aws/us-east-1"
    text = (tmp_path / "events.jsonl").read_text()
    assert "AKIAXXXX" not in text and "t0k" not in text
    assert redact({"a": {"password": "x", "b": 1}}) == {"a": {"password": "***", "b": 1}}


def test_plots_render_png(tmp_path: Path) -> None:
    a = plot_throughput([1, 2, 3, 4], [10.0, 9.0, 5.0, 9.5], [(3, "slowdown"), (4, "move")], tmp_path / "t.png")
    b = plot_prices({"aws p3": ([0, 1, 2], [3.0, 1.0, 1.2])}, [(1.0, "aws p3")], tmp_path / "p.png")
    for path in (a, b):
        assert path.read_bytes()[:4] == b"\x89PNG"
