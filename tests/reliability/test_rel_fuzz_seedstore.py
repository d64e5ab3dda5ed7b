"""Hypothesis fuzzing of every seedstore RPC against a real `seedstore serve` over a Unix socket.

Requests are built from random strings (unicode, path tricks such as "../x",
"/etc/passwd", ".hidden", "a/b", plus valid identifiers so that some writes
succeed), numbers across their whole proto range (uint32, Duration seconds
and nanos), and out-of-range enum values. For every call:

* the status is OK or a documented error: never UNKNOWN, never INTERNAL, and
  always an ErrorInfo whose reason is in the seedstore taxonomy;
* nothing outside the store root changed: the sandbox holding the store, the
  server's working directory, its TMPDIR and some bystander files is
  snapshotted (names, sizes, modes, mtimes) before and after each call.

The store starts with a valid seed, the same id in two domains (ambiguous) and
a malformed file. Evidence commands found by VerifySeeds resolve against an
empty PATH directory, so a fuzzed command can never run a real program by name.

Sizes (environment):
    RELIABILITY_FUZZ_EXAMPLES  examples per RPC (CI 100, full 500)
    RELIABILITY_FULL=1         every default at full size
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from agentsidecar.seedstore_service.patch import AddSpec
from agentsidecar.seedstore_service.seedfile import parse_seed
from agentsidecar.seedstore_service.store import SeedStore
from tests.reliability.rel_support import (
    UNDECODABLE,
    Figures,
    Sidecar,
    Sizes,
    decoded,
    make_short_dir,
    raw_call,
    seedstore_error_problem,
    snapshot_difference,
    snapshot_tree,
    start_seedstore,
)

EXAMPLES = Sizes.from_env(os.environ).fuzz_examples
# Examples sized by RELIABILITY_FUZZ_EXAMPLES (the run's depth); the rest is the suite's profile.
FUZZ = settings(max_examples=EXAMPLES)
CALL_TIMEOUT_SECONDS = 60.0
_Message = TypeVar("_Message", bound=Message)
UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

NASTY = (
    "",
    ".",
    "..",
    "../x",
    "../../etc/passwd",
    "/etc/passwd",
    "/tmp",
    ".hidden",
    ".seedstore.lock",
    "a/b",
    "a\\b",
    "..\\x",
    "%2e%2e%2fx",
    "x" * 300,
    "say.yml",
    "capabilities",
    "~",
    "$HOME",
    "*",
    "-",
    "_",
    "a..b",
    " ",
    "\t",
    "é",
    "\U0001f600",
    "CON",
    "say",
    "voice",
    "speech",
    "broken",
    "text_to_speech",
)
# The seeds the store starts with (and their domains), so lookups often find something.
EXISTING = ("say", "probe", "broken", "voice", "speech")
ids = st.one_of(
    st.sampled_from(EXISTING),
    st.sampled_from(NASTY),
    st.from_regex(r"[a-z0-9_][a-z0-9_.\-]{0,11}", fullmatch=True),
    st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40),
)
texts = st.one_of(
    st.sampled_from(NASTY), st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=60)
)
short_lists = st.lists(ids, max_size=4)
uint32s = st.one_of(
    st.sampled_from((0, 1, 100, 101, 255, 256, 2**31, UINT32_MAX)), st.integers(0, UINT32_MAX)
)
enum_values = st.one_of(st.integers(0, 3), st.integers(INT32_MIN, INT32_MAX))


@dataclass
class FuzzedStore:
    server: Sidecar
    sandbox: Path
    root: Path
    channel: grpc.Channel
    stub: seedstore_pb2_grpc.SeedStoreServiceStub
    calls: dict[str, int]
    oks: dict[str, int]
    errors: dict[str, int]
    written: int = 0

    def snapshot(self) -> dict[str, tuple[str, int, int, int]]:
        return snapshot_tree(self.sandbox, excluded=[self.root])


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, figures: Figures) -> Iterator[FuzzedStore]:
    sandbox = tmp_path_factory.mktemp("seedstore-fuzz")
    home = sandbox / "home"
    root = home / "capabilities"
    for directory in ("cwd", "tmp", "empty-bin"):
        (sandbox / directory).mkdir()
    # Bystanders: a fuzzed path that escaped the store would most likely land on one of these.
    (sandbox / "outside.yml").write_text("id: outside\ndomain: d\nkind: cli\n")
    (sandbox / "x").write_text("bystander\n")
    store = SeedStore(root)
    store.add(AddSpec(id="say", domain="voice", kind="cli", command="say", provides=("text_to_speech",)))
    store.add(AddSpec(id="say", domain="speech", kind="cli", command="say", provides=("text_to_speech",)))
    store.add(
        AddSpec(
            id="probe",
            domain="voice",
            kind="cli",
            provides=("probe",),
            evidence_commands=("/etc/passwd", "../x"),
        )
    )
    (root / "voice" / "broken.yml").write_text("id: broken\ndomain: voice\nkind: [unclosed\n")
    socket_dir = make_short_dir("rel-fz-")
    server = start_seedstore(
        home,
        socket_dir / "ss.sock",
        sandbox.parent / f"{sandbox.name}-seedstore.log",
        check_path=str(sandbox / "empty-bin"),
        cwd=sandbox / "cwd",
        extra_env={"TMPDIR": str(sandbox / "tmp"), "HOME": str(sandbox / "cwd")},
    )
    channel = grpc.insecure_channel(server.target)
    fuzzed_store = FuzzedStore(
        server, sandbox, root, channel, seedstore_pb2_grpc.SeedStoreServiceStub(channel), {}, {}, {}
    )
    try:
        yield fuzzed_store
        assert server.alive(), server.log_tail()
        figures.record(
            "fuzz_seedstore_rpcs",
            {
                "examples_per_rpc": EXAMPLES,
                "calls": dict(sorted(fuzzed_store.calls.items())),
                "ok": dict(sorted(fuzzed_store.oks.items())),
                "writes_read_back": fuzzed_store.written,
                "documented_errors": dict(sorted(fuzzed_store.errors.items())),
                "unknown_or_internal": 0,
                "files_touched_outside_store": 0,
            },
        )
    finally:
        channel.close()
        server.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def check_call(fuzzed: FuzzedStore, name: str, call: Callable[[], Any]) -> Any:
    """Run one call; assert a documented outcome and an untouched world outside the store."""
    before = fuzzed.snapshot()
    result: Any = None
    try:
        result = call()
        fuzzed.oks[name] = fuzzed.oks.get(name, 0) + 1
    except grpc.RpcError as error:
        status = decoded(error)
        problem = seedstore_error_problem(status)
        assert problem is None, f"{name}: {problem}"
        key = f"{status.code.name}/{status.reason}"
        fuzzed.errors[key] = fuzzed.errors.get(key, 0) + 1
    fuzzed.calls[name] = fuzzed.calls.get(name, 0) + 1
    changes = snapshot_difference(before, fuzzed.snapshot())
    assert changes == [], f"{name} touched files outside the store: {changes}"
    return result


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def durations() -> st.SearchStrategy[duration_pb2.Duration]:
    return st.builds(
        lambda seconds, nanos: duration_pb2.Duration(seconds=seconds, nanos=nanos),
        st.one_of(
            st.sampled_from((0, 1, 600, 601, -1, INT64_MIN, INT64_MAX)), st.integers(INT64_MIN, INT64_MAX)
        ),
        st.one_of(st.sampled_from((0, 1, 999_999_999, -1)), st.integers(INT32_MIN, INT32_MAX)),
    )


def with_optionals(message: _Message, **values: Any) -> _Message:
    for name, value in values.items():
        if value is not None:
            setattr(message, name, value)
    return message


def either(valid: st.SearchStrategy[Any], nasty: st.SearchStrategy[Any], mostly_valid: bool) -> Any:
    """In mostly-valid requests every field is valid, so the write path runs; otherwise anything goes."""
    return valid if mostly_valid else st.one_of(valid, nasty)


identifiers = st.from_regex(r"[a-z0-9_][a-z0-9_.\-]{0,11}", fullmatch=True)
# Free text with at least one letter, so an alias passes the "no letters or digits" rule.
lettered = texts.map(lambda text: "a" + text)
ties = st.tuples(identifiers, texts).map(lambda pair: f"{pair[0]}={pair[1]}")


@st.composite
def add_requests(draw: st.DrawFn) -> pb.AddSeedRequest:
    mostly_valid = draw(st.booleans())

    def pick(valid: st.SearchStrategy[Any], nasty: st.SearchStrategy[Any]) -> Any:
        return draw(either(valid, nasty, mostly_valid))

    request = pb.AddSeedRequest(
        id=pick(st.one_of(identifiers, st.sampled_from(EXISTING)), ids),
        domain=pick(st.one_of(identifiers, st.sampled_from(EXISTING)), ids),
        kind=draw(texts),
        provides=pick(st.lists(identifiers, min_size=1, max_size=3), short_lists),
        aliases=pick(st.lists(lettered, max_size=3), st.lists(texts, max_size=3)),
        preferred_for=draw(short_lists),
        avoid_for=draw(short_lists),
        ties=pick(st.lists(ties, max_size=3), st.lists(texts, max_size=3)),
        auth_env=draw(st.lists(texts, max_size=3)),
        external_service=draw(st.booleans()),
        may_cost_money=draw(st.booleans()),
        evidence_commands=draw(st.lists(texts, max_size=3)),
    )
    return with_optionals(
        request,
        command=draw(optional(texts)),
        adapter=draw(optional(texts)),
        script=draw(optional(texts)),
        priority=pick(optional(st.integers(0, 100)), optional(uint32s)),
        suggested_skill_id=draw(optional(texts)),
    )


@st.composite
def update_requests(draw: st.DrawFn) -> pb.UpdateSeedRequest:
    mostly_valid = draw(st.booleans())

    def pick(valid: st.SearchStrategy[Any], nasty: st.SearchStrategy[Any]) -> Any:
        return draw(either(valid, nasty, mostly_valid))

    request = pb.UpdateSeedRequest(
        id=pick(st.sampled_from(("say", "probe")), ids),
        clear_command=draw(st.booleans()),
        clear_priority=draw(st.booleans()),
        clear_suggested_skill_id=draw(st.booleans()),
        add_provides=pick(st.lists(identifiers, max_size=3), short_lists),
        remove_provides=pick(st.lists(identifiers, max_size=2), short_lists),
        add_aliases=pick(st.lists(lettered, max_size=3), st.lists(texts, max_size=3)),
        remove_aliases=draw(st.lists(texts, max_size=2)),
        add_preferred_for=pick(st.lists(identifiers, max_size=2), short_lists),
        add_ties=pick(st.lists(ties, max_size=3), st.lists(texts, max_size=3)),
        remove_ties=pick(st.lists(identifiers, max_size=2), st.lists(texts, max_size=2)),
        add_auth_env=draw(st.lists(texts, max_size=2)),
        add_evidence_commands=draw(st.lists(texts, max_size=2)),
        remove_evidence_commands=draw(st.lists(texts, max_size=2)),
        mark=pick(st.integers(0, 2), enum_values),
    )
    return with_optionals(
        request,
        domain=pick(st.sampled_from(("voice", "speech")), optional(ids)),
        expected_revision=draw(optional(texts)),
        kind=draw(optional(texts)),
        command=draw(optional(texts)),
        script=draw(optional(texts)),
        priority=pick(optional(st.integers(0, 100)), optional(uint32s)),
        external_service=draw(optional(st.booleans())),
        may_cost_money=draw(optional(st.booleans())),
        suggested_skill_id=draw(optional(texts)),
    )


def assert_written_file_loads(fuzzed: FuzzedStore, path: str, seed_id: str) -> None:
    """What a write put on disk must read back: never a file its own loader refuses."""
    written = Path(path)
    assert written.is_relative_to(fuzzed.root), path
    assert ".." not in written.parts, path
    seed = parse_seed(written.read_text(encoding="utf-8"), path)
    assert seed.id == seed_id
    fuzzed.written += 1


@FUZZ
@given(request=add_requests())
def test_fuzz_add_seed(fuzzed: FuzzedStore, request: pb.AddSeedRequest) -> None:
    response = check_call(
        fuzzed, "AddSeed", lambda: fuzzed.stub.AddSeed(request, timeout=CALL_TIMEOUT_SECONDS)
    )
    if response is not None:
        assert_written_file_loads(fuzzed, response.path, request.id)


@FUZZ
@given(request=update_requests())
def test_fuzz_update_seed(fuzzed: FuzzedStore, request: pb.UpdateSeedRequest) -> None:
    response = check_call(
        fuzzed, "UpdateSeed", lambda: fuzzed.stub.UpdateSeed(request, timeout=CALL_TIMEOUT_SECONDS)
    )
    if response is not None:
        assert_written_file_loads(fuzzed, response.path, request.id)


@FUZZ
@given(domain=optional(ids))
def test_fuzz_list_seeds(fuzzed: FuzzedStore, domain: str | None) -> None:
    request = with_optionals(pb.ListSeedsRequest(), domain=domain)
    check_call(fuzzed, "ListSeeds", lambda: fuzzed.stub.ListSeeds(request, timeout=CALL_TIMEOUT_SECONDS))


@FUZZ
@given(
    capability=texts,
    domain=optional(ids),
    local_only=st.booleans(),
    preferred=optional(ids),
    broaden=st.booleans(),
)
def test_fuzz_search_seeds(
    fuzzed: FuzzedStore,
    capability: str,
    domain: str | None,
    local_only: bool,
    preferred: str | None,
    broaden: bool,
) -> None:
    request = with_optionals(
        pb.SearchSeedsRequest(capability=capability, local_only=local_only, broaden=broaden),
        domain=domain,
        preferred_seed=preferred,
    )
    check_call(fuzzed, "SearchSeeds", lambda: fuzzed.stub.SearchSeeds(request, timeout=CALL_TIMEOUT_SECONDS))


@FUZZ
@given(id=ids, domain=optional(ids))
def test_fuzz_inspect_seed(fuzzed: FuzzedStore, id: str, domain: str | None) -> None:
    request = with_optionals(pb.InspectSeedRequest(id=id), domain=domain)
    check_call(fuzzed, "InspectSeed", lambda: fuzzed.stub.InspectSeed(request, timeout=CALL_TIMEOUT_SECONDS))


@FUZZ
@given(
    ids=st.lists(ids, max_size=3),
    domain=optional(ids),
    all_in_domain=st.booleans(),
    check_timeout=optional(durations()),
    concurrency=uint32s,
)
def test_fuzz_verify_seeds(
    fuzzed: FuzzedStore,
    ids: list[str],
    domain: str | None,
    all_in_domain: bool,
    check_timeout: duration_pb2.Duration | None,
    concurrency: int,
) -> None:
    request = pb.VerifySeedsRequest(ids=ids, all_in_domain=all_in_domain, concurrency=concurrency)
    with_optionals(request, domain=domain)
    if check_timeout is not None:
        request.check_timeout.CopyFrom(check_timeout)
    events = check_call(
        fuzzed, "VerifySeeds", lambda: list(fuzzed.stub.VerifySeeds(request, timeout=CALL_TIMEOUT_SECONDS))
    )
    for event in events or ():
        if event.HasField("seed_verified"):
            assert Path(event.seed_verified.path).is_relative_to(fuzzed.root)


@FUZZ
@given(
    id=st.one_of(st.sampled_from(("say", "probe")), ids),
    domain=optional(st.one_of(st.sampled_from(("voice", "speech")), ids)),
    for_capability=st.one_of(identifiers, texts),
    priority=optional(st.one_of(st.integers(0, 100), uint32s)),
)
def test_fuzz_prefer_seed(
    fuzzed: FuzzedStore, id: str, domain: str | None, for_capability: str, priority: int | None
) -> None:
    request = with_optionals(
        pb.PreferSeedRequest(id=id, for_capability=for_capability), domain=domain, priority=priority
    )
    response = check_call(
        fuzzed, "PreferSeed", lambda: fuzzed.stub.PreferSeed(request, timeout=CALL_TIMEOUT_SECONDS)
    )
    if response is not None:
        assert_written_file_loads(fuzzed, response.path, id)


@FUZZ
@given(domain=optional(ids))
def test_fuzz_watch_seeds(fuzzed: FuzzedStore, domain: str | None) -> None:
    request = with_optionals(pb.WatchSeedsRequest(), domain=domain)

    def watch() -> None:
        # The call object is also a grpc.Future (done, cancel), which the stubs do not say.
        call: Any = fuzzed.stub.WatchSeeds(request, timeout=CALL_TIMEOUT_SECONDS)
        try:
            # Headers arrive once the watcher is subscribed; a refused request has ended by then.
            call.initial_metadata()
            if call.done():
                list(call)  # raises the status it ended with
        finally:
            call.cancel()

    check_call(fuzzed, "WatchSeeds", watch)


def test_fuzz_calls_without_input(fuzzed: FuzzedStore) -> None:
    store = check_call(fuzzed, "GetStore", lambda: fuzzed.stub.GetStore(pb.GetStoreRequest(), timeout=30))
    assert store.seed_store == str(fuzzed.root)
    scan = check_call(fuzzed, "ScanSeeds", lambda: fuzzed.stub.ScanSeeds(pb.ScanSeedsRequest(), timeout=30))
    assert scan.seed_store == str(fuzzed.root)


# Last: removals thin out the store the other RPCs work on.
@FUZZ
@given(id=ids, domain=optional(ids))
def test_fuzz_remove_seed(fuzzed: FuzzedStore, id: str, domain: str | None) -> None:
    request = with_optionals(pb.RemoveSeedRequest(id=id), domain=domain)
    response = check_call(
        fuzzed, "RemoveSeed", lambda: fuzzed.stub.RemoveSeed(request, timeout=CALL_TIMEOUT_SECONDS)
    )
    if response is not None:
        assert Path(response.path).is_relative_to(fuzzed.root)


SEEDSTORE_METHODS = tuple(
    (method.name, method.server_streaming)
    for method in pb.DESCRIPTOR.services_by_name["SeedStoreService"].methods
    if not method.client_streaming
)


@pytest.mark.parametrize(
    ("method", "streaming"), SEEDSTORE_METHODS, ids=[name for name, _ in SEEDSTORE_METHODS]
)
def test_undecodable_request_bytes_are_not_unknown(fuzzed: FuzzedStore, method: str, streaming: bool) -> None:
    call = raw_call(
        fuzzed.channel, f"/{pb.DESCRIPTOR.services_by_name['SeedStoreService'].full_name}/{method}", streaming
    )
    with pytest.raises(grpc.RpcError) as caught:
        call(UNDECODABLE)
    assert caught.value.code() is not grpc.StatusCode.UNKNOWN, caught.value.details()
