"""Work runs off the GUI thread; its results come back on the GUI thread."""

import threading

import pytest

from app.tasks import Tasks


@pytest.fixture
def tasks(qapp):
    t = Tasks()
    yield t
    t.cancel_streams()
    assert t.wait(5000)


def _on_gui_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def test_result_arrives_on_gui_thread(qtbot, tasks):
    seen = {}

    def work(a, b=0):
        seen["worker_thread"] = threading.current_thread()
        return a + b

    with qtbot.waitCallback() as cb:
        tasks.run(work, 2, b=3, on_done=lambda r: cb((r, _on_gui_thread())))
    assert cb.args == [(5, True)]
    assert seen["worker_thread"] is not threading.main_thread()


def test_error_arrives_on_gui_thread(qtbot, tasks):
    def work():
        raise ValueError("boom")

    with qtbot.waitCallback() as cb:
        tasks.run(work, on_done=lambda r: pytest.fail("no result expected"),
                  on_error=lambda e: cb((e, _on_gui_thread())))
    error, on_gui = cb.args[0]
    assert isinstance(error, ValueError) and on_gui


def test_stream_batches_items_in_order_on_gui_thread(qtbot, tasks):
    batches, threads = [], set()

    def on_items(items):
        batches.append(items)
        threads.add(_on_gui_thread())

    with qtbot.waitCallback() as done:
        tasks.stream(lambda n: iter(range(n)), 2000, on_items=on_items, on_done=done)
    assert [i for b in batches for i in b] == list(range(2000))
    assert len(batches) < 2000 / 10  # coalesced, not one repaint per item
    assert threads == {True}


def test_cancel_stops_items_and_closes_the_source(qtbot, tasks):
    closed = threading.Event()
    got = []

    def endless():
        try:
            while True:
                yield "x"
                threading.Event().wait(0.005)
        finally:
            closed.set()

    ended = []
    task = tasks.stream(endless, on_items=got.extend, on_done=lambda: ended.append(True))
    qtbot.waitUntil(lambda: len(got) > 3)
    task.cancel()
    count = len(got)
    qtbot.waitUntil(lambda: ended == [True])
    assert closed.is_set()
    assert len(got) == count  # nothing delivered after cancel


def test_stream_error_is_reported(qtbot, tasks):
    def failing():
        yield 1
        raise ConnectionError("node went away")

    items = []
    with qtbot.waitCallback() as cb:
        tasks.stream(failing, on_items=items.extend, on_error=cb)
    assert isinstance(cb.args[0], ConnectionError)
    assert items == [1]
