"""SeedStoreClient and AsyncSeedStoreClient against the real seedstore service, every RPC."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
import pytest

from agentsidecar.clients import (
    AmbiguousSeedError,
    AsyncSeedStoreClient,
    InvalidArgumentError,
    RevisionConflictError,
    SeedMalformedError,
    SeedNotFoundError,
    SeedStoreClient,
)
from agentsidecar.clients.seedstore import AddSeedFields
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from tests.clients.sidecars import ServerHandle
from tests.procs import process_alive


def say(domain: str = "voice") -> AddSeedFields:
    return {
        "id": "say",
        "domain": domain,
        "kind": "cli",
        "command": "true",
        "provides": ["text_to_speech"],
        "evidence_commands": ["true"],
    }


SAY = say()


def test_sync_client_covers_every_unary_rpc(seedstore: ServerHandle) -> None:
    assert seedstore.home is not None
    store = str(seedstore.home / "capabilities")
    with SeedStoreClient(seedstore.unix) as client:
        assert client.get_store().seed_store == store

        added = client.add_seed(**SAY)
        assert (added.seed.id, added.path) == ("say", f"{store}/voice/say.yml")
        assert list(added.seed.provides) == ["text_to_speech"]

        updated = client.update_seed(id="say", add_aliases=["speak"], expected_revision=added.revision)
        assert list(updated.seed.aliases) == ["speak"]
        assert updated.revision != added.revision

        listing = client.list_seeds(domain="voice")
        assert [(e.id, e.revision) for e in listing.seeds] == [("say", updated.revision)]

        found = client.search_seeds(capability="text_to_speech", local_only=True)
        assert found.selected == "say"
        assert found.candidates[0].reasons[0] == "direct provides match: text_to_speech"

        assert client.inspect_seed(id="say", domain="voice").revision == updated.revision
        preferred = client.prefer_seed(id="say", for_capability="voice_message", priority=80)
        assert list(preferred.seed.rank.preferred_for) == ["voice_message"]
        assert preferred.seed.rank.default_priority == 80

        assert client.scan_seeds().proposals == []
        # A request proto still works, positionally, as the CLIs pass it.
        assert client.list_seeds(pb.ListSeedsRequest()).seeds[0].id == "say"

        removed = client.remove_seed(id="say")
        assert removed.removed
        assert client.list_seeds().seeds == []


async def test_async_client_covers_every_unary_rpc(seedstore: ServerHandle) -> None:
    async with AsyncSeedStoreClient(seedstore.tcp) as client:
        store = (await client.get_store()).seed_store
        added = await client.add_seed(pb.AddSeedRequest(**SAY))
        assert added.path == f"{store}/voice/say.yml"
        updated = await client.update_seed(id="say", priority=30)
        assert updated.seed.rank.default_priority == 30
        assert [e.id for e in (await client.list_seeds()).seeds] == ["say"]
        found = await client.search_seeds(capability="voice_message", broaden=True)
        assert found.broadening.first_search_empty
        assert [c.matched_capability for c in found.candidates] == ["text_to_speech"]
        assert (await client.inspect_seed(id="say")).seed.command == "true"
        assert list((await client.prefer_seed(id="say", for_capability="tts")).seed.rank.preferred_for) == [
            "tts"
        ]
        scanned = await client.scan_seeds()
        assert (list(scanned.proposals), scanned.seed_store) == ([], store)
        assert (await client.remove_seed(id="say", domain="voice")).removed


def test_request_proto_and_keyword_fields_do_not_mix(seedstore: ServerHandle) -> None:
    with SeedStoreClient(seedstore.unix) as client, pytest.raises(TypeError, match="not both"):
        client.inspect_seed(pb.InspectSeedRequest(id="say"), domain="voice")


def test_verify_yields_typed_events_live_then_the_verdict(seedstore: ServerHandle) -> None:
    with SeedStoreClient(seedstore.unix) as client:
        client.add_seed(**SAY)
        events = list(client.verify("say", domain="voice", check_timeout=5))
        raw = list(client.verify_seeds(ids=["say"]))
    assert [type(e).__name__ for e in events] == [
        "CheckStarted",
        "CheckFinished",
        "CheckStarted",
        "CheckFinished",
        "SeedVerified",
    ]
    finished = [e for e in events if isinstance(e, pb.CheckFinished)]
    assert [(e.check, e.ok) for e in finished] == [
        ("path_lookup:true", True),
        ("evidence_command:true", True),
    ]
    verdict = events[-1]
    assert isinstance(verdict, pb.SeedVerified)
    assert verdict.status == pb.VERIFICATION_STATUS_VERIFIED
    assert [r.WhichOneof("event") for r in raw][-1] == "seed_verified"
    assert all(r.seed_store for r in raw)


def test_sync_watch_reports_changes(seedstore: ServerHandle) -> None:
    with SeedStoreClient(seedstore.unix) as client:
        client.add_seed(**SAY)
        stop = threading.Event()

        def keep_changing() -> None:  # until the watch, subscribed at some point, reports one
            priority = 0
            while not stop.wait(0.1):
                priority += 1
                client.update_seed(id="say", priority=priority)

        changer = threading.Thread(target=keep_changing)
        changer.start()
        try:
            for change in client.watch(domain="voice", timeout=10):
                assert (change.kind, change.id, change.domain) == (pb.CHANGE_KIND_UPDATED, "say", "voice")
                assert change.seed.rank.default_priority > 0
                break
        finally:
            stop.set()
            changer.join()


async def test_async_verify_and_watch(seedstore: ServerHandle) -> None:
    async with AsyncSeedStoreClient(seedstore.unix) as client:
        changes = client.watch(domain="voice")
        waiting = asyncio.ensure_future(anext(changes))
        await client.add_seed(**SAY)
        priority = 0
        while not waiting.done():  # until the watch is subscribed and reports a change
            priority += 1
            await client.update_seed(id="say", priority=priority)
            await asyncio.wait([waiting], timeout=0.1)
        first = waiting.result()
        assert (first.id, first.domain) == ("say", "voice")
        assert first.kind in (pb.CHANGE_KIND_ADDED, pb.CHANGE_KIND_UPDATED)

        events = [event async for event in client.verify("say")]
        verdict = events[-1]
        assert isinstance(verdict, pb.SeedVerified)
        async with asyncio.timeout(5):
            async for change in changes:
                if change.kind == pb.CHANGE_KIND_VERIFIED:
                    assert change.revision == verdict.revision
                    break
        await changes.aclose()


def test_errors_are_the_typed_tree(seedstore: ServerHandle) -> None:
    assert seedstore.home is not None
    with SeedStoreClient(seedstore.unix) as client:
        with pytest.raises(SeedNotFoundError) as missing:
            client.inspect_seed(id="nope")
        assert missing.value.seed_id == "nope"
        assert missing.value.original is not None
        assert missing.value.original.code() is grpc.StatusCode.NOT_FOUND

        with pytest.raises(InvalidArgumentError) as invalid:
            client.search_seeds(capability="Not Valid")
        assert invalid.value.fields == ("capability",)

        first = client.add_seed(**SAY)
        client.update_seed(id="say", add_aliases=["one"])
        with pytest.raises(RevisionConflictError) as conflict:
            client.update_seed(id="say", add_aliases=["two"], expected_revision=first.revision)
        assert conflict.value.expected == first.revision
        assert conflict.value.actual != first.revision

        client.add_seed(**say("audio"))
        with pytest.raises(AmbiguousSeedError) as ambiguous:
            client.inspect_seed(id="say")
        assert sorted(Path(p).parent.name for p in ambiguous.value.paths) == ["audio", "voice"]

        broken = seedstore.home / "capabilities" / "voice" / "broken.yml"
        broken.write_text("id: broken\ndomain: voice\nprovides: [x\n")
        with pytest.raises(SeedMalformedError) as malformed:
            client.inspect_seed(id="broken", domain="voice")
        assert (malformed.value.path, malformed.value.line > 0) == (str(broken), True)

        # Before any event of a stream, too.
        with pytest.raises(SeedNotFoundError):
            list(client.verify("nope"))


async def test_async_errors_are_the_typed_tree(seedstore: ServerHandle) -> None:
    async with AsyncSeedStoreClient(seedstore.unix) as client:
        with pytest.raises(SeedNotFoundError):
            await client.remove_seed(id="nope")
        with pytest.raises(InvalidArgumentError) as invalid:
            [event async for event in client.verify("Bad")]
        assert invalid.value.fields == ("ids",)


async def test_leaving_an_async_verify_loop_stops_the_running_check(
    seedstore: ServerHandle, tmp_path: Path
) -> None:
    pid_file = tmp_path / "check.pid"
    hang = f"sh -c 'echo $$ > {pid_file}; exec sleep 30'"
    async with AsyncSeedStoreClient(seedstore.unix) as client:
        await client.add_seed(id="hang", domain="voice", kind="cli", provides=["x"], evidence_commands=[hang])
        async for event in client.verify("hang"):
            if isinstance(event, pb.CheckStarted) and event.check.startswith("evidence_command"):
                deadline = time.monotonic() + 10
                while not (pid_file.exists() and pid_file.read_text().strip()):
                    assert time.monotonic() < deadline, "the evidence command never started"
                    await asyncio.sleep(0.02)
                break  # leaving the loop is all it takes to cancel the call
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while process_alive(pid):
            assert time.monotonic() < deadline, "the check outlived its cancelled call"
            await asyncio.sleep(0.02)
        assert not (await client.inspect_seed(id="hang")).seed.HasField("verification")


def _add_seeds(client: SeedStoreClient, count: int) -> None:
    for number in range(count):
        client.add_seed(
            pb.AddSeedRequest(id=f"say-{number:02d}", domain="voice", kind="cli", provides=["text_to_speech"])
        )


def test_sync_client_walks_every_page(seedstore: ServerHandle) -> None:
    with SeedStoreClient(seedstore.unix) as client:
        _add_seeds(client, 12)
        pages = list(client.list_pages(page_size=5))
        assert [len(page.seeds) for page in pages] == [5, 5, 2]
        assert [page.next_page_token != "" for page in pages] == [True, True, False]
        merged = client.list_all_seeds(page_size=5)
        assert [entry.id for entry in merged.seeds] == [f"say-{number:02d}" for number in range(12)]
        assert merged.next_page_token == ""
        with pytest.raises(InvalidArgumentError):
            client.list_seeds(page_token="forged")


@pytest.mark.slow
async def test_async_client_walks_every_page(seedstore: ServerHandle) -> None:
    with SeedStoreClient(seedstore.unix) as client:
        _add_seeds(client, 12)
    async with AsyncSeedStoreClient(seedstore.unix) as client:
        merged = await client.list_all_seeds(page_size=5, domain="voice")
        assert [entry.id for entry in merged.seeds] == [f"say-{number:02d}" for number in range(12)]
        assert merged.domain == "voice"
