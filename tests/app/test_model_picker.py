"""The chat's model picker, like LM Studio's: size, whether it fits, loaded or loading
(with the load's progress), and a model spread over machines said in plain words."""

from app.model_picker import ModelPicker
from app.snapshots import node_cards
from app.tasks import Tasks
from engine.records import ModelCard, StatusInfo

GB = 10**9


def topology(*memories_gb):
    return {"nodes": [{"id": f"n{i}", "name": f"mac{i}", "self": i == 0, "reachable": True,
                       "trusted": True, "machine": {"memory": {
                           "total_bytes": gb * GB, "available_bytes": gb * GB}}}
                      for i, gb in enumerate(memories_gb)], "links": []}


def card(model_id, size_gb, instance=None):
    shoal = {"size_bytes": int(size_gb * GB)}
    if instance:
        shoal["instance"] = instance
    return ModelCard.from_json({"id": model_id, "shoal": shoal})


def test_the_picker_says_size_fit_and_loaded_state(qtbot):
    picker = ModelPicker()
    qtbot.addWidget(picker)
    three = {"id": "i1", "model": "big", "strategy": "pipeline", "state": "ready",
             "ranks": [{"rank": r, "node": f"n{r}", "layers": [r * 10, r * 10 + 10]}
                       for r in range(3)]}
    picker.set_models([card("small", 2), card("medium", 60), card("big", 90, three)])
    picker.set_cards(node_cards(topology(64, 64, 64)))
    loading = {"state": "loading", "model": "small", "runner": {
        "type": "Loading", "model": "small", "layers_done": 3, "layers_total": 12}}
    picker.set_status(loading)

    assert picker.detail("small") == "2.0 GB · fits this machine · loading 25%"
    assert picker.detail("medium").startswith("60.0 GB · needs 2 machines")
    assert picker.detail("big").endswith("running on 3 machines, split by layers")
    assert "node" not in picker.detail("big") and "rank" not in picker.detail("big")
    assert picker.shown_text(0) == "small  —  2.0 GB · fits this machine · loading 25%"
    assert picker.itemText(0) == "small"  # what is sent stays the id

    picker.set_status({"state": "idle", "model": "small", "runner": {
        "type": "Ready", "model": "small", "context_length": 8192, "pid": 1}})
    assert picker.detail("small") == "2.0 GB · fits this machine · loaded"
    picker.set_status({"state": "idle", "model": "small", "runner": {
        "type": "Ready", "model": "small", "context_length": 8192, "pid": 1,
        "engine": "llamacpp"}})  # a Linux CPU node serving its GGUF
    assert picker.detail("small") == "2.0 GB · fits this machine · loaded on llama.cpp"


def test_the_chat_shows_the_load_and_what_the_node_has(qtbot, tiny_node, home):
    from app.chat import ChatPane
    from app.conversations import ConversationStore
    tasks = Tasks()
    pane = ChatPane(tiny_node.client, ConversationStore(home), tasks)
    qtbot.addWidget(pane)
    pane.set_node_status({"state": "loading", "model": "tiny-llama", "runner": {
        "type": "Loading", "model": "tiny-llama", "layers_done": 1, "layers_total": 4}})
    assert pane.load_bar.isVisibleTo(pane) and pane.load_bar.value() == 1
    assert pane.load_bar.maximum() == 4 and pane.model_state.text() == "Loading 1/4 layers…"

    pane.refresh_models()
    qtbot.waitUntil(lambda: pane.model_picker.count() > 0, timeout=10000)
    pane.set_node_status(tiny_node.client.status().to_json())
    assert not pane.load_bar.isVisibleTo(pane)
    detail = pane.model_picker.detail("tiny-llama")
    assert detail.endswith("loaded") and ("kB" in detail or "MB" in detail)
    assert tasks.wait(10000)


def test_a_status_record_reads_the_same(qtbot):
    """The app keeps the status as JSON (StatusInfo.to_json): the picker reads that."""
    picker = ModelPicker()
    qtbot.addWidget(picker)
    picker.set_models([card("m", 1)])
    picker.set_status(StatusInfo.from_json({"state": "loading", "model": "m", "runner": {
        "type": "Preparing", "model": "m", "step": "importing", "done": 1,
        "total": 2}}).to_json())
    assert picker.detail("m") == "1.0 GB · preparing 50%"  # no machines known: no fit said
