"""WatchSeeds: changes made through the service and by other programs reach every watcher."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc

from .conftest import ServerThread

_END = object()


class Watcher:
    """A WatchSeeds call read by a background thread; `next()` waits for the next change."""

    def __init__(self, target: str, domain: str | None = None) -> None:
        self._channel = grpc.insecure_channel(target)
        stub = seedstore_pb2_grpc.SeedStoreServiceStub(self._channel)
        self._call = stub.WatchSeeds(pb.WatchSeedsRequest(domain=domain))
        # The server sends headers once it has subscribed: nothing after this is missed.
        self._call.initial_metadata()
        self._events: queue.Queue[object] = queue.Queue()
        self.ended_with: grpc.StatusCode | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self._events.put(response)
            self.ended_with = grpc.StatusCode.OK
        except grpc.RpcError as error:
            self.ended_with = error.code()
        self._events.put(_END)

    def next(self, timeout: float = 5.0) -> pb.WatchSeedsResponse:
        event = self._events.get(timeout=timeout)
        assert isinstance(event, pb.WatchSeedsResponse), "the watch stream ended"
        return event

    def nothing_more(self, wait: float = 0.4) -> bool:
        time.sleep(wait)
        return self._events.empty()

    def wait_end(self, timeout: float = 5.0) -> grpc.StatusCode | None:
        self._thread.join(timeout)
        return self.ended_with

    def close(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]
        self._channel.close()


@pytest.fixture
def watcher(server: ServerThread) -> Iterator[Watcher]:
    watching = Watcher(server.unix_target)
    yield watching
    watching.close()


def seed(seed_id: str, domain: str = "voice") -> pb.AddSeedRequest:
    return pb.AddSeedRequest(
        id=seed_id, domain=domain, kind="cli", command="voice-cli", provides=["text_to_speech"]
    )


@pytest.mark.slow
def test_changes_through_the_service_are_reported(server: ServerThread, watcher: Watcher, home: Path) -> None:
    path = str(home / "capabilities" / "voice" / "say.yml")
    with SeedStoreClient(server.unix_target) as client:
        added = client.add_seed(seed("say"))
        event = watcher.next()
        assert (event.kind, event.id, event.domain, event.path) == (
            pb.CHANGE_KIND_ADDED,
            "say",
            "voice",
            path,
        )
        assert event.revision == added.revision
        assert event.seed == added.seed

        updated = client.update_seed(pb.UpdateSeedRequest(id="say", add_aliases=["speak"]))
        event = watcher.next()
        assert (event.kind, event.revision) == (pb.CHANGE_KIND_UPDATED, updated.revision)
        assert list(event.seed.aliases) == ["speak"]

        verdicts = [
            r for r in client.verify_seeds(pb.VerifySeedsRequest(ids=["say"])) if r.HasField("seed_verified")
        ]
        event = watcher.next()
        assert (event.kind, event.revision) == (pb.CHANGE_KIND_VERIFIED, verdicts[0].seed_verified.revision)
        assert event.seed.verification.status == pb.VERIFICATION_STATUS_VERIFIED

        client.remove_seed(pb.RemoveSeedRequest(id="say"))
        event = watcher.next()
        assert (event.kind, event.id, event.revision) == (pb.CHANGE_KIND_REMOVED, "say", "")
        assert not event.HasField("seed")
    assert watcher.nothing_more()


@pytest.mark.slow
def test_edits_by_other_programs_are_reported(server: ServerThread, watcher: Watcher, home: Path) -> None:
    with SeedStoreClient(server.unix_target) as client:
        client.add_seed(seed("say"))
    assert watcher.next().kind == pb.CHANGE_KIND_ADDED
    path = home / "capabilities" / "voice" / "say.yml"

    # Nobody tells the service: its background refresh must notice.
    path.write_text(path.read_text().replace("kind: cli", "kind: adapter"))
    event = watcher.next()
    assert (event.kind, event.id, event.seed.kind) == (pb.CHANGE_KIND_UPDATED, "say", "adapter")

    (home / "capabilities" / "audio").mkdir()
    (home / "capabilities" / "audio" / "espeak.yml").write_text(
        "id: espeak\ndomain: audio\nkind: cli\nprovides:\n- text_to_speech\n"
    )
    event = watcher.next()
    assert (event.kind, event.id, event.domain) == (pb.CHANGE_KIND_ADDED, "espeak", "audio")

    path.write_text("id: say\ndomain: voice\nkind: cli\nprovides: [text_to_speech\n")
    event = watcher.next()
    assert (event.kind, event.id) == (pb.CHANGE_KIND_MALFORMED, "say")
    assert event.problem.path == str(path)
    assert event.problem.line > 0
    assert not event.HasField("seed")

    (home / "capabilities" / "audio" / "espeak.yml").unlink()
    event = watcher.next()
    assert (event.kind, event.id, event.domain) == (pb.CHANGE_KIND_REMOVED, "espeak", "audio")


@pytest.mark.slow
def test_every_watcher_gets_the_changes_of_its_domain(server: ServerThread, watcher: Watcher) -> None:
    audio = Watcher(server.unix_target, domain="audio")
    try:
        with SeedStoreClient(server.unix_target) as client:
            client.add_seed(seed("say"))
            client.add_seed(seed("espeak", domain="audio"))
        assert [watcher.next().id, watcher.next().id] == ["say", "espeak"]
        assert audio.next().id == "espeak"
        assert audio.nothing_more()
    finally:
        audio.close()


def test_shutdown_ends_watch_streams_promptly(start_server: Callable[..., ServerThread]) -> None:
    server = start_server(grace_seconds=20.0)
    watching = Watcher(server.unix_target)
    try:
        started = time.monotonic()
        server.stop()
        assert watching.wait_end(timeout=20) == grpc.StatusCode.OK
        # Far within the grace period: an open watch stream does not hold shutdown up.
        assert time.monotonic() - started < 10
    finally:
        watching.close()
