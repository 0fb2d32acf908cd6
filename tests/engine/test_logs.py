"""Logs that can't fill the disk: one line a second for a message repeated in a flood,
with a count; files rotated at their size cap (engine/logs.py)."""

from __future__ import annotations

import logging

from engine.logs import OncePerSecond, rotate_if_big, rotating_file


def test_a_repeated_message_is_written_once_a_second_with_a_count(tmp_path):
    # The filter's clock moves only when the test says: a loaded machine writing 10,000
    # lines slowly must not let a second "refused" through mid-flood.
    now = [1000.0]
    log = logging.getLogger("test.flood")
    log.propagate = False
    log.setLevel(logging.INFO)
    handlers = [logging.FileHandler(tmp_path / "a.log"), logging.FileHandler(tmp_path / "b.log")]
    limit = OncePerSecond(every=0.3, clock=lambda: now[0])
    for h in handlers:
        h.addFilter(limit)
        log.addHandler(h)
    try:
        for i in range(5000):
            log.warning("refused a connection from %s", f"10.0.0.{i % 250}")
            log.info("request %d started", i)  # below warnings: never held back
        log.warning("something else")
        now[0] += 0.35
        log.warning("refused a connection from %s", "10.0.0.1")
    finally:
        for h in handlers:
            log.removeHandler(h)
            h.close()
    for name in ("a.log", "b.log"):  # every handler sees the same records
        lines = (tmp_path / name).read_text().splitlines()
        started = [x for x in lines if x.startswith("request ")]
        assert len(started) == 5000
        lines = [x for x in lines if not x.startswith("request ")]
        assert lines[0] == "refused a connection from 10.0.0.0"
        assert lines[1] == "something else"
        assert lines[2].startswith("refused a connection from 10.0.0.1 (and 4999 more like it")
        assert len(lines) == 3


def test_logs_rotate_at_their_cap(tmp_path, monkeypatch):
    import engine.logs as logs
    monkeypatch.setattr(logs, "MAX_BYTES", 1000)
    h = rotating_file(tmp_path / "node.log")
    log = logging.getLogger("test.rotate")
    log.propagate = False
    log.addHandler(h)
    try:
        for i in range(500):
            log.warning("line %d %s", i, "x" * 50)
    finally:
        log.removeHandler(h)
        h.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["node.log", "node.log.1", "node.log.2", "node.log.3"]
    assert all((tmp_path / f).stat().st_size <= 1100 for f in files)
    worker = tmp_path / "worker.log"  # a log another process writes, rotated at its start
    worker.write_text("x" * 2000)
    rotate_if_big(worker, limit=1000)
    assert not worker.exists() and (tmp_path / "worker.log.1").stat().st_size == 2000
