"""The output-schema validator, chosen by measurement: jsonschema-rs against jsonschema and fastjsonschema.

    python -m bench.bench_validators [--quick]

A cold Produce meets a schema no call before it had: the negotiator must refuse
it if it breaks the draft 2020-12 metaschema, compile it, and check the reply
against it with format checks. Each library does that here to the same schemas
(`bench_negotiator.output_schema`, the 20 properties of the bench's cold
Produce, each text new), in this process, with no gRPC:

* cold: a new schema checked against its metaschema, compiled and applied to one
  instance that meets it, per schema;
* warm: a compiled validator applied to an instance that meets it, and to one that
  breaks it in four places, every violation collected (fastjsonschema raises at the
  first: its figure is for one);
* the messages each gives for that instance, so speed is never bought with worse
  errors;
* the negotiator's own whole check of a schema text for a dispatched call
  (`negotiation.check_schema_text`: parse, metaschema, compile, the formats walk),
  beside the jsonschema-rs compile it is built on.

Ratios are each library's figure over jsonschema-rs's (the one the negotiator
uses), measured in the same rounds: rounds alternate the libraries' order (A B C,
C B A, ...) and each figure is the median of the rounds' medians.

What each checks: jsonschema-rs (`Draft202012Validator(validate_formats=True,
offline=True)`, as `negotiation.schema_validator`) and jsonschema
(`Draft202012Validator.check_schema`, then the validator with its
FORMAT_CHECKER) apply draft 2020-12. fastjsonschema implements drafts 4, 6 and 7
only: it compiles the schema without its `$schema` (draft 7) and checks it
against the draft-7 metaschema with a validator it compiled once, before the
rounds. fastjsonschema is optional (`pip install -e '.[bench]'`); without
it its rows say so.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import jsonschema
import jsonschema_rs

from bench.bench_negotiator import SCHEMA_PROPERTIES, output_schema
from bench.harness import Settings
from bench.report import Row, info_row, missing_row, render_table

JSON_SCHEMA_RS = "jsonschema-rs"

Instance = dict[str, object]


@dataclass(frozen=True)
class Library:
    """One validator library: how it checks and compiles a schema, and applies the compiled form."""

    name: str
    version: str
    what: str  # the draft and format checks it applies
    cold: Callable[[dict[str, Any]], Callable[[Instance], bool]]  # check + compile; the is-valid test
    errors: Callable[[dict[str, Any]], Callable[[Instance], list[str]]]  # compile; the messages


def _rs_library() -> Library:
    def compiled(schema: dict[str, Any]) -> jsonschema_rs.Validator:
        # What negotiation.schema_validator builds; compiling applies the metaschema.
        return jsonschema_rs.Draft202012Validator(schema, validate_formats=True, offline=True)

    def errors(schema: dict[str, Any]) -> Callable[[Instance], list[str]]:
        validator = compiled(schema)
        return lambda instance: [error.message for error in validator.iter_errors(instance)]

    return Library(
        JSON_SCHEMA_RS,
        metadata.version("jsonschema_rs"),
        "draft 2020-12, formats",
        lambda schema: compiled(schema).is_valid,
        errors,
    )


def _jsonschema_library() -> Library:
    draft = jsonschema.Draft202012Validator

    def compiled(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
        draft.check_schema(schema)
        return draft(schema, format_checker=draft.FORMAT_CHECKER)

    def errors(schema: dict[str, Any]) -> Callable[[Instance], list[str]]:
        validator = compiled(schema)
        return lambda instance: [error.message for error in validator.iter_errors(instance)]

    return Library(
        "jsonschema",
        metadata.version("jsonschema"),
        "draft 2020-12, formats (FORMAT_CHECKER)",
        lambda schema: compiled(schema).is_valid,
        errors,
    )


def _fastjsonschema_library() -> Library | None:
    try:
        fast: Any = importlib.import_module("fastjsonschema")
    except ImportError:
        return None
    metaschema = fast.compile(dict(jsonschema.Draft7Validator.META_SCHEMA))
    invalid = fast.JsonSchemaValueException

    def compiled(schema: dict[str, Any]) -> Callable[[Instance], object]:
        as_draft_7 = {key: value for key, value in schema.items() if key != "$schema"}
        metaschema(as_draft_7)
        validate: Callable[[Instance], object] = fast.compile(as_draft_7)
        return validate

    def is_valid(validate: Callable[[Instance], object]) -> Callable[[Instance], bool]:
        def test(instance: Instance) -> bool:
            try:
                validate(instance)
            except invalid:
                return False
            return True

        return test

    def errors(schema: dict[str, Any]) -> Callable[[Instance], list[str]]:
        validate = compiled(schema)

        def messages(instance: Instance) -> list[str]:
            try:
                validate(instance)
            except invalid as error:
                return [str(error.message)]
            return []

        return messages

    return Library(
        "fastjsonschema",
        metadata.version("fastjsonschema"),
        "draft 7 at most (no 2020-12), formats; stops at the first error",
        lambda schema: is_valid(compiled(schema)),
        errors,
    )


def libraries() -> tuple[list[Library], list[str]]:
    """The libraries to compare (jsonschema-rs first), and the names of those not installed."""
    found = [_rs_library(), _jsonschema_library()]
    fast = _fastjsonschema_library()
    if fast is None:
        return found, ["fastjsonschema"]
    return [*found, fast], []


def valid_instance(schema: Mapping[str, Any]) -> Instance:
    """An instance with every property of an `output_schema` schema, each meeting its subschema."""
    values: dict[str, object] = {"string": "text", "integer": 7, "boolean": True, "array": ["a", "b"]}
    instance: Instance = {}
    for name, subschema in schema["properties"].items():
        kind = subschema["type"]
        instance[name] = "ops@example.org" if subschema.get("format") == "email" else values[kind]
    return instance


def invalid_instance(schema: Mapping[str, Any]) -> Instance:
    """`valid_instance` broken in four places: two types, a minimum and an email format."""
    instance = valid_instance(schema)
    instance["summary"] = 3
    instance["ok"] = "no"
    properties = schema["properties"]
    instance[next(name for name, sub in properties.items() if sub.get("minimum") == 0)] = -1
    instance[next(name for name, sub in properties.items() if sub.get("format") == "email")] = "not-an-email"
    return instance


def _schemas(tag: str, count: int) -> Iterator[dict[str, Any]]:
    """`count` parsed schemas, every one's text new (property names carry `tag` and a number)."""
    for index in range(count):
        yield json.loads(output_schema(f"{tag}{index}"))


def _per_call_us(work: Callable[[Instance], object], instance: Instance, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        work(instance)
    return (time.perf_counter() - started) / calls * 1e6


def _cold_us(library: Library, schemas: list[dict[str, Any]], instance: Instance) -> float:
    started = time.perf_counter()
    for schema in schemas:
        if not library.cold(schema)(instance):
            raise AssertionError(f"{library.name} refused an instance that meets the schema")
    return (time.perf_counter() - started) / len(schemas) * 1e6


def _negotiator_check_us(texts: list[str]) -> float:
    from agentsidecar.negotiator_service import negotiation

    started = time.perf_counter()
    for text in texts:
        checked, _parsed = negotiation.check_schema_text(text, compile=True)
        if checked.problems:
            raise AssertionError(f"the negotiator refused a bench schema: {checked.problems}")
    return (time.perf_counter() - started) / len(texts) * 1e6


def _rs_compile_us(schemas: list[dict[str, Any]]) -> float:
    started = time.perf_counter()
    for schema in schemas:
        jsonschema_rs.Draft202012Validator(schema, validate_formats=True, offline=True)
    return (time.perf_counter() - started) / len(schemas) * 1e6


@dataclass
class Figures:
    """Per library (and the negotiator's own check), each round's µs per schema or call."""

    cold: dict[str, list[float]]
    valid: dict[str, list[float]]
    invalid: dict[str, list[float]]
    negotiator_check: list[float]
    rs_compile: list[float]


def measure(found: list[Library], rounds: int, schemas_per_round: int, calls: int) -> Figures:
    """Each library's figures, the libraries' order alternating round by round."""
    figures = Figures(
        cold={library.name: [] for library in found},
        valid={library.name: [] for library in found},
        invalid={library.name: [] for library in found},
        negotiator_check=[],
        rs_compile=[],
    )
    warm_schema = json.loads(output_schema("warm"))
    good, bad = valid_instance(warm_schema), invalid_instance(warm_schema)
    applied = {library.name: (library.cold(warm_schema), library.errors(warm_schema)) for library in found}
    for name, (is_valid, errors) in applied.items():
        if not is_valid(good) or is_valid(bad) or not errors(bad):
            raise AssertionError(f"{name} does not tell the bench's instances apart")
    for round_index in range(rounds):
        order = found if round_index % 2 == 0 else list(reversed(found))
        for library in order:
            schemas = list(_schemas(f"{library.name}-{round_index}-", schemas_per_round))
            figures.cold[library.name].append(_cold_us(library, schemas, valid_instance(schemas[0])))
            is_valid, errors = applied[library.name]
            figures.valid[library.name].append(_per_call_us(is_valid, good, calls))
            figures.invalid[library.name].append(_per_call_us(errors, bad, calls))
        texts = [output_schema(f"negotiator-{round_index}-{index}") for index in range(schemas_per_round)]
        figures.negotiator_check.append(_negotiator_check_us(texts))
        figures.rs_compile.append(
            _rs_compile_us(list(_schemas(f"compile-{round_index}-", schemas_per_round)))
        )
    return figures


def _ratio_row(label: str, name: str, values: dict[str, list[float]], note: str = "") -> Row:
    subject = statistics.median(values[name])
    baseline = statistics.median(values[JSON_SCHEMA_RS])
    rounds = ", ".join(f"{s:.1f}/{b:.1f}" for s, b in zip(values[name], values[JSON_SCHEMA_RS], strict=True))
    return Row(
        benchmark=f"{label}: {name}{note}",
        subject=f"{subject:.1f} µs",
        baseline=f"{JSON_SCHEMA_RS} {baseline:.1f} µs",
        relation=f"{subject / baseline:.2f}×",
        goal="—",
        met=None,
        rounds=f"µs per round, subject/{JSON_SCHEMA_RS}: {rounds}",
    )


def rows_of(found: list[Library], figures: Figures, missing: list[str]) -> list[Row]:
    """The table: each library against jsonschema-rs, the messages, the negotiator's own check."""
    size = f"a new {SCHEMA_PROPERTIES}-property schema"
    rows = [info_row(f"validators: {library.name} {library.version}", library.what) for library in found]
    for library in found:
        rows.append(
            _ratio_row(
                f"validators, cold ({size}: metaschema check, compile, one valid instance)",
                library.name,
                figures.cold,
            )
        )
    for library in found:
        rows.append(_ratio_row("validators, warm: a valid instance", library.name, figures.valid))
    for library in found:
        first_only = " (first error only)" if library.name == "fastjsonschema" else ""
        rows.append(
            _ratio_row(
                "validators, warm: an instance with 4 violations, every error",
                library.name,
                figures.invalid,
                first_only,
            )
        )
    schema = json.loads(output_schema("messages"))
    bad = invalid_instance(schema)
    for library in found:
        messages = library.errors(schema)(bad)
        rows.append(info_row(f"validators, messages for that instance: {library.name}", " · ".join(messages)))
    check = statistics.median(figures.negotiator_check)
    compile_us = statistics.median(figures.rs_compile)
    rows.append(
        info_row(
            f"negotiator: check_schema_text of {size}, dispatched (parse, metaschema, compile, formats)",
            f"{check:.1f} µs",
            f"jsonschema-rs compile alone {compile_us:.1f} µs",
            f"{check / compile_us:.2f}×",
        )
    )
    for name in missing:
        rows.append(
            missing_row(f"validators: {name}", "—", f"{name} is not installed (pip install -e '.[bench]')")
        )
    return rows


async def run(settings: Settings, rows: list[Row]) -> None:
    found, missing = libraries()
    if settings.quick:
        figures = measure(found, rounds=2, schemas_per_round=30, calls=300)
    else:
        figures = measure(found, rounds=settings.rounds, schemas_per_round=200, calls=3000)
    rows.extend(rows_of(found, figures, missing))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and schemas (a smoke run)")
    args = parser.parse_args()
    import tempfile
    from pathlib import Path

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Settings.for_run(quick=args.quick, workdir=Path(tmp)), rows))
    print(render_table(rows))


if __name__ == "__main__":
    main()
