"""Conversations survive a restart; a damaged file is kept aside, never lost."""

import json

import pytest

from app.conversations import ConversationStore, Message


def test_conversations_survive_restart(home):
    store = ConversationStore(home)
    conv = store.new(model="tiny")
    conv.title = "Greetings"
    conv.messages += [Message("user", "Hello"),
                      Message("assistant", "Hi there", stats={"generation_tps": 41.5}),
                      Message("assistant", "", error="Model 'x' not found")]
    store.new()
    store.save()

    again = ConversationStore(home)
    assert again.warning is None
    assert [c.id for c in again.conversations] == [c.id for c in store.conversations]
    restored = again.get(conv.id)
    assert restored.title == "Greetings" and restored.model == "tiny"
    assert restored.messages == conv.messages
    # Failed replies are shown but never sent back to the model.
    assert restored.history() == [{"role": "user", "content": "Hello"},
                                  {"role": "assistant", "content": "Hi there"}]


def test_delete_is_persisted(home):
    store = ConversationStore(home)
    keep, gone = store.new(), store.new()
    store.delete(gone.id)
    store.save()
    assert [c.id for c in ConversationStore(home).conversations] == [keep.id]


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"conversations": [{}]}'])
def test_corrupt_file_is_moved_aside_not_lost(home, content):
    path = home / "conversations.json"
    path.write_text(content)

    store = ConversationStore(home)
    assert store.conversations == []
    assert "couldn't be read" in store.warning
    aside = list(home.glob("conversations.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == content
    assert str(aside[0]) in store.warning

    store.new()
    store.save()
    assert len(json.loads(path.read_text())["conversations"]) == 1
    assert aside[0].read_text() == content


def test_failed_write_keeps_previous_file(home, monkeypatch):
    store = ConversationStore(home)
    store.new().title = "Precious"
    store.save()
    before = (home / "conversations.json").read_text()

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("app.conversations.json.dump", disk_full)
    store.new()
    with pytest.raises(OSError):
        store.save()
    assert (home / "conversations.json").read_text() == before
    assert [p.name for p in home.iterdir()] == ["conversations.json"]  # no temp file left


def test_a_deleted_conversation_is_restored_where_it_was(home):
    store = ConversationStore(home)
    a, b, c = store.new(), store.new(), store.new()
    store.delete(b.id)
    assert store.conversations == [c, a]
    store.restore(b, 1)
    store.restore(b, 0)  # twice is once
    assert store.conversations == [c, b, a]
