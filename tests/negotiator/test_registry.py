"""The adapter registry and its change feed."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable

import pytest
from fakes import FakeAdapter, make_declaration

from agentsidecar.negotiator_service.errors import AdapterAlreadyExists, AdapterNotFound, AdapterNotRemovable
from agentsidecar.negotiator_service.model import AdapterKind
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter


def entry(name: str, source: str = "runtime", target: str = "") -> RegisteredAdapter:
    return RegisteredAdapter(FakeAdapter(make_declaration(name)), source, target)


async def next_change(watch: AsyncIterator[tuple[str, RegisteredAdapter]]) -> tuple[str, str]:
    change, registered = await asyncio.wait_for(anext(watch), timeout=2)
    return change, registered.shortname


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def test_add_get_list_and_declaration() -> None:
    registry = AdapterRegistry()
    beta, alpha = entry("beta", "config"), entry("alpha", target="unix:/tmp/a.sock")
    registry.add(beta)
    registry.add(alpha)
    assert registry.get("beta") is beta
    assert registry.list() == [alpha, beta]
    assert registry.declaration("alpha") is alpha.adapter.declaration
    assert registry.get("alpha").target == "unix:/tmp/a.sock"
    assert len(registry) == 2


def test_duplicate_shortname_is_refused() -> None:
    registry = AdapterRegistry()
    registry.add(entry("a"))
    with pytest.raises(AdapterAlreadyExists, match='"a"'):
        registry.add(entry("a"))


def test_unknown_shortname_is_not_found_everywhere() -> None:
    registry = AdapterRegistry()
    for operation in (registry.get, registry.declaration, registry.remove):
        with pytest.raises(AdapterNotFound, match='"ghost"'):
            operation("ghost")


def test_remove_returns_the_runtime_entry() -> None:
    registry = AdapterRegistry()
    runtime = entry("r")
    registry.add(runtime)
    assert registry.remove("r") is runtime
    assert registry.list() == []


def test_config_adapters_are_not_removable() -> None:
    registry = AdapterRegistry()
    registry.add(entry("c", "config"))
    with pytest.raises(AdapterNotRemovable):
        registry.remove("c")
    assert [e.shortname for e in registry.list()] == ["c"]


async def test_watch_yields_existing_then_changes_in_order() -> None:
    registry = AdapterRegistry()
    registry.add(entry("b"))
    registry.add(entry("a", "config"))
    watch = registry.watch()
    assert await next_change(watch) == ("existing", "a")
    assert await next_change(watch) == ("existing", "b")
    registry.add(entry("c"))
    registry.remove("b")
    assert await next_change(watch) == ("registered", "c")
    assert await next_change(watch) == ("deregistered", "b")
    await watch.aclose()


async def test_every_watcher_gets_every_change() -> None:
    registry = AdapterRegistry()
    first, second = registry.watch(), registry.watch()
    consumers = [asyncio.create_task(next_change(w)) for w in (first, second)]
    await until(lambda: registry.watcher_count == 2)
    registry.add(entry("x"))
    assert await asyncio.gather(*consumers) == [("registered", "x"), ("registered", "x")]
    await first.aclose()
    await second.aclose()


async def test_a_change_between_snapshot_and_reading_is_seen_once() -> None:
    registry = AdapterRegistry()
    registry.add(entry("a"))
    watch = registry.watch()
    assert await next_change(watch) == ("existing", "a")
    # The watcher is between the snapshot and its queue: nothing may be lost.
    registry.add(entry("b"))
    registry.remove("a")
    assert await next_change(watch) == ("registered", "b")
    assert await next_change(watch) == ("deregistered", "a")
    await watch.aclose()


async def test_a_watcher_that_stops_is_unsubscribed() -> None:
    registry = AdapterRegistry()
    registry.add(entry("a"))
    watch = registry.watch()
    await next_change(watch)
    assert registry.watcher_count == 1
    await watch.aclose()
    assert registry.watcher_count == 0
    registry.add(entry("b"))  # publishing to nobody is fine


@pytest.mark.slow
async def test_a_watcher_abandoned_mid_loop_is_unsubscribed() -> None:
    registry = AdapterRegistry()
    registry.add(entry("a"))

    async def read_one() -> None:
        async for _change in registry.watch():
            break

    await read_one()
    gc.collect()
    # The loop's async-generator finaliser schedules aclose().
    await until(lambda: registry.watcher_count == 0)


async def test_close_ends_watches_and_closes_adapters() -> None:
    registry = AdapterRegistry()
    adapter = FakeAdapter(make_declaration("a", AdapterKind.HARNESS))
    registry.add(RegisteredAdapter(adapter, "config"))
    seen: list[str] = []

    async def consume() -> None:
        async for change, _registered in registry.watch():
            seen.append(change)

    consumer = asyncio.create_task(consume())
    await until(lambda: seen == ["existing"])
    await registry.close()
    await asyncio.wait_for(consumer, timeout=2)
    assert seen == ["existing"]
    assert adapter.close_count == 1
    assert registry.list() == []
    assert [c async for c in registry.watch()] == []  # a closed registry has nothing to watch


class MonitoredFake(FakeAdapter):
    """A FakeAdapter that reports changes as a remote adapter does: through `monitor`'s callback."""

    def __init__(self, name: str) -> None:
        super().__init__(make_declaration(name))
        self.serving_detail = ""
        self.refresh_seconds: float | None = None
        self.changed: Callable[[], None] = lambda: None

    @property
    def serving(self) -> bool:
        return not self.serving_detail

    def monitor(self, refresh_seconds: float, changed: Callable[[], None]) -> None:
        self.refresh_seconds = refresh_seconds
        self.changed = changed


async def test_a_monitored_adapter_s_changes_are_published_as_updated_while_it_is_registered() -> None:
    registry = AdapterRegistry(refresh_seconds=0.5)
    watch = registry.watch()
    first = asyncio.ensure_future(anext(watch))  # subscribes
    await until(lambda: registry.watcher_count == 1)
    fake = MonitoredFake("remote")
    monitored = RegisteredAdapter(fake, "runtime", "unix:/tmp/r.sock")
    registry.add(monitored)
    assert fake.refresh_seconds == 0.5
    assert (await first)[0] == "registered"

    fake.serving_detail = "gone"
    fake.changed()
    change, seen = await asyncio.wait_for(anext(watch), timeout=2)
    assert (change, seen.serving_detail) == ("updated", "gone")

    registry.remove("remote")
    assert await next_change(watch) == ("deregistered", "remote")
    fake.changed()  # a change reported after removal is nobody's news
    registry.add(entry("other"))
    assert await next_change(watch) == ("registered", "other")
    assert entry("plain").serving_detail == ""  # a local adapter always serves
    await registry.close()
