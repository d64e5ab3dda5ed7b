"""The seedstore sends its gate rule and ask window: InspectSeed's `required_gates` are the gates a
search's candidate carries for the same file, and SearchSeeds says its ask window, over a real server."""

from __future__ import annotations

from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.common.v1 import common_pb2
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service.ranking import ASK_WITHIN_POINTS
from agentsidecar.sidecar_runtime.wire_names import Gate

from .conftest import ServerThread

ALL_GATES = [common_pb2.Gate.Value(f"GATE_{gate.name}") for gate in Gate]


def test_inspect_sends_the_same_gates_as_the_search_and_the_search_its_window(server: ServerThread) -> None:
    with SeedStoreClient(server.unix_target) as client:
        client.add_seed(
            id="cloud",
            domain="voice",
            kind="cli",
            command="say",
            provides=["tts"],
            external_service=True,
            may_cost_money=True,
            auth_env=["VOICE_KEY"],
        )
        client.add_seed(id="plain", domain="voice", kind="cli", command="say", provides=["tts"])
        found = client.search_seeds(capability="tts")
        gates = {c.id: list(c.required_gates) for c in found.candidates}
        for seed_id in ("cloud", "plain"):
            inspected = client.inspect_seed(pb.InspectSeedRequest(id=seed_id, domain="voice"))
            assert list(inspected.required_gates) == gates[seed_id]
        assert found.ask_window_points == ASK_WITHIN_POINTS
    assert gates == {"cloud": ALL_GATES, "plain": []}
