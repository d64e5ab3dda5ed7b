"""The probing shell: sends the probes `probes.plan` chooses through an adapter, keeps the evidence.

Probes cost tokens, so they run only when asked (ProbeAdapter, `negotiator
probe`) or configured (`probe:` in the config: at start-up, then every
`every_seconds` when set). The evidence lives on the adapter, in memory: a
restarted negotiator starts from the code and config declaration and
probes again what the config lists. Each probe that changes what an
adapter shows (its evidence, and with it possibly its declaration and
version) is published as an "updated" change to WatchAdapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from agentsidecar.negotiator_service import probes
from agentsidecar.negotiator_service.config import ProbeSchedule
from agentsidecar.negotiator_service.errors import AdapterFailure, AdapterNotProbeable
from agentsidecar.negotiator_service.probes import Probeable, ProbeEvidence, ProbeKind, ProbeVerdict
from agentsidecar.negotiator_service.registry import AdapterRegistry, RegisteredAdapter

logger = logging.getLogger(__name__)


async def run_probes(adapter: Probeable, model: str) -> tuple[ProbeEvidence, ...]:
    """Send `model`'s probes one after another; the evidence, in order."""
    evidence: list[ProbeEvidence] = []
    model_missing = False
    for request in probes.plan(adapter.declaration, model, strict=adapter.probe_strict(model)):
        if model_missing:
            evidence.append(probes.not_sent(request, f"/models does not list {model}", datetime.now(UTC)))
            continue
        try:
            status, body = await adapter.probe_exchange(request)
        except AdapterFailure as exc:  # unreachable, timed out, no API key, reply too large
            evidence.append(probes.unanswered(request, exc.message, datetime.now(UTC)))
            continue
        item = probes.judge(request, status, body, datetime.now(UTC))
        model_missing = item.kind is ProbeKind.MODELS and item.verdict is ProbeVerdict.FAILED
        evidence.append(item)
    return tuple(evidence)


class Prober:
    """Runs probes against the registry's adapters, one probe run per adapter at a time."""

    def __init__(self, registry: AdapterRegistry, schedule: ProbeSchedule | None = None) -> None:
        self._registry = registry
        self._schedule = schedule
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    async def probe(
        self, shortname: str, model: str = ""
    ) -> tuple[RegisteredAdapter, tuple[ProbeEvidence, ...]]:
        """Probe `model` (default: the adapter's default model) of `shortname`'s upstream."""
        entry = self._registry.get(shortname)
        adapter = entry.adapter
        if not isinstance(adapter, Probeable):
            raise AdapterNotProbeable(shortname, entry.adapter.implementation)
        model = model or adapter.declaration.default_model
        lock = self._locks.setdefault(shortname, asyncio.Lock())
        async with lock:
            evidence = await run_probes(adapter, model)
            adapter.record_probes(model, evidence)
        self._registry.changed(shortname, entry)
        return entry, evidence

    def start(self) -> None:
        """Run the configured probes now and, with `every_seconds`, on that schedule (in the background)."""
        if self._schedule is not None and self._schedule.adapters and self._task is None:
            self._task = asyncio.create_task(self._scheduled(self._schedule), name="negotiator-probes")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _scheduled(self, schedule: ProbeSchedule) -> None:
        while True:
            for shortname, models in sorted(schedule.adapters.items()):
                for model in models or ("",):
                    try:
                        _, evidence = await self.probe(shortname, model)
                    except Exception:  # one adapter's failure must not stop the others' probes
                        logger.exception("probing adapter %s (model %r) failed", shortname, model)
                        continue
                    verdicts = ", ".join(f"{e.kind.value}={e.verdict.value}" for e in evidence)
                    logger.info("probed adapter %s, model %s: %s", shortname, model or "(default)", verdicts)
            if schedule.every_seconds is None:
                return
            await asyncio.sleep(schedule.every_seconds)
