"""The embedded broker (casehub/broker.py): a message appears in the queue's folder only whole.

kombu's filesystem transport wrote a message into a file already under its final name; a worker
polling the folder took one such file before it was written, failed to decode it and exited,
with the message gone. Seen under `make run`: a worker restarted with a JSONDecodeError.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection
from kombu.exceptions import ChannelError

from casehub import broker


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Any]:
    folder = tmp_path / "broker"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    with Connection(
        "filesystem://", transport="casehub.broker:Transport", transport_options=options
    ) as connection:
        yield connection.default_channel


def _messages(channel: Any) -> list[str]:
    return sorted(name for name in os.listdir(channel.data_folder_out) if name.endswith(".msg"))


def test_the_embedded_broker_is_this_transport(channel: Any) -> None:
    assert isinstance(channel, broker.Channel)


def test_a_message_is_renamed_into_its_queue_once_written_whole(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    renamed: list[str] = []
    replace = os.replace

    def checked(source: str, target: str) -> None:
        # at the rename: nothing a consumer would read yet, the file beside it whole
        assert _messages(channel) == []
        assert source == target + broker.WRITING_SUFFIX
        assert json.loads(Path(source).read_text())["body"] == "whole"
        renamed.append(target)
        replace(source, target)

    monkeypatch.setattr(broker.os, "replace", checked)
    channel._put("celery", {"body": "whole"})
    assert len(renamed) == 1 and _messages(channel) == [os.path.basename(renamed[0])]
    assert renamed[0].endswith(".celery.msg")
    assert channel._get("celery") == {"body": "whole"}
    with pytest.raises(Empty):
        channel._get("celery")


def test_a_message_that_cannot_be_written_raises_and_leaves_nothing(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(source: str, target: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(broker.os, "replace", full)
    with pytest.raises(ChannelError, match="Cannot add file"):
        channel._put("celery", {"body": "lost"})
    assert os.listdir(channel.data_folder_out) == []


def test_a_consumer_polling_while_messages_are_written_gets_each_once_whole(channel: Any) -> None:
    sent = 400
    received: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def consume() -> None:
        try:
            while len(received) < sent and not done.is_set():
                try:
                    received.append(channel._get("celery")["n"])
                except Empty:
                    continue
        except BaseException as exc:  # a half-written message fails to decode
            errors.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        for n in range(sent):
            channel._put("celery", {"n": n, "padding": "x" * 2000})
        consumer.join(timeout=60)
    finally:
        done.set()
        consumer.join()
    assert errors == []
    assert sorted(received) == list(range(sent))
