"""The embedded mode's broker: kombu's filesystem transport, with every message written whole.

kombu's own transport creates a message's file under its final name and then writes it; a worker
polling the folder (every 50 ms here) can take the file in between, read it empty, fail to decode
it and exit, with the message already removed: the task is lost (a planning run that never starts
leaves its case in `planning` until the reconciler's lease runs out) and the worker restarts (the
symptom of kombu's open issue 1551, "Expecting value: line 1 column 1 (char 0)"). Here
a message is written under a name the consumers skip and renamed into place once whole; a rename
within one folder is atomic, so a consumer sees no file or the whole message.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

# What a message's file is called while it is written: its consumers read only `*.<queue>.msg`.
WRITING_SUFFIX = ".writing"


class Channel(filesystem.Channel):
    """A filesystem channel whose messages appear in the folder only when whole."""

    # kombu names the argument `message` in one base class and `payload` in the other
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put `payload` on `queue`: written beside it, then renamed to the name consumers read."""
        # The name kombu gives it (ordered by the time it was sent), as its consumers expect.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        writing = final + WRITING_SUFFIX
        try:
            with open(writing, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(writing, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(writing)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    """kombu's filesystem transport with `Channel`'s whole-message writes."""

    Channel = Channel
