"""The charts' per-request points come from the node's own records of the requests it
served (GET /shoal/finished, the records its /metrics counts): a request from any client,
not only the app's chat, is a point, once, with the figures the client was told."""

from __future__ import annotations

import openai

from app.charts import ChartsView
from app.metrics import Metrics
from app.polling import Poller
from app.tasks import Tasks


def test_a_request_from_another_client_is_a_point_once(qtbot, tiny_node):
    metrics = Metrics()
    charts = ChartsView(metrics)
    qtbot.addWidget(charts)
    metrics.add_finished(tiny_node.client.finished())  # what other tests asked for
    before = len(metrics.requests)
    tasks = Tasks()
    poller = Poller(tasks, tiny_node.url, metrics.read_finished, 0.1)
    poller.updated.connect(metrics.add_finished)
    poller.start()
    try:
        oai = openai.OpenAI(base_url=tiny_node.url + "/v1", api_key="x", max_retries=0)
        r = oai.chat.completions.create(
            model="tiny-llama", max_tokens=8, messages=[{"role": "user", "content": "Hi!"}])
        speed = ((r.model_extra or {}).get("shoal") or {}).get("generation_tps")
        qtbot.waitUntil(lambda: any(q.decode_tps for q in metrics.requests), timeout=10000)
        with qtbot.waitSignal(poller.updated, timeout=5000):
            poller.poke()  # read again: the same record is not a second point
        with qtbot.waitSignal(poller.updated, timeout=5000):
            poller.poke()
    finally:
        poller.stop()
        tasks.wait(5000)
    points = list(metrics.requests)[before:]
    assert len(points) == 1 and points[0].model == "tiny-llama"
    assert points[0].ttft_s and points[0].ttft_s > 0
    assert speed and points[0].decode_tps == speed  # what the client was told
    charts.tick()
    assert len(charts.tps_curve.getData()[1]) == before + 1
