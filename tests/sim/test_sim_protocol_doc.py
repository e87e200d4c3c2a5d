"""The frames printed in docs/protocol.md are exactly what the implementation sends, and decode."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hud_pipelines.errors import Phase
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import (
    PROTOCOL_VERSION,
    ErrorFrame,
    Framing,
    Hello,
    MessageType,
    Observation,
    Reset,
    Step,
    to_wire,
)
from hud_pipelines.wire.parse import parse_hello, parse_reply, parse_request
from tests.conftest import REPO

DOC = REPO / "docs" / "protocol.md"
FRAME = re.compile(r"<!-- frame: (?P<name>[\w-]+) -->\s*```text\n(?P<hex>.*?)```", re.DOTALL)

EXPECTED = {
    "client-hello": (Hello(protocol=PROTOCOL_VERSION, framing=Framing.SCALAR), Framing.SCALAR),
    "reset-scalar": (Reset(seq=1, tasks=[{"seed": 7}]), Framing.SCALAR),
    "step-scalar": (Step(seq=2, action=np.array([[1]], dtype=np.int64)), Framing.SCALAR),
    "observation-scalar": (
        Observation(
            seq=2,
            observation={"state": np.array([[0.5, -0.25, 0.125, 2.0]], np.float32)},
            reward=np.array([1.0]),
            terminated=np.array([False]),
            truncated=np.array([False]),
            success=np.array([False]),
            success_reported=np.array([False]),
            success_now=np.array([False]),
            status=["running"],
        ),
        Framing.SCALAR,
    ),
    "step-batched": (Step(seq=3, action=np.array([[0.5], [-1.0]], dtype=np.float32)), Framing.BATCHED),
    "error-step": (
        ErrorFrame(
            phase=Phase.STEP,
            seq=4,
            message="action has shape [3], expected int64[A=1] (names ['action_0'])",
        ),
        Framing.BATCHED,
    ),
}


def doc_frames() -> dict[str, bytes]:
    return {m["name"]: bytes.fromhex(m["hex"]) for m in FRAME.finditer(DOC.read_text())}


def test_the_doc_shows_every_example_frame() -> None:
    assert set(doc_frames()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_doc_frame_is_byte_for_byte_what_the_implementation_sends(name: str) -> None:
    message, framing = EXPECTED[name]
    assert doc_frames()[name] == packb(to_wire(message, framing))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_doc_frame_decodes_and_parses(name: str) -> None:
    message, framing = EXPECTED[name]
    decoded = unpackb(doc_frames()[name])
    match message:
        case Hello():
            assert parse_hello(decoded) == message
        case Step():
            parsed = parse_request(decoded, framing)
            assert isinstance(parsed, Step)
            np.testing.assert_array_equal(parsed.action, message.action)
            assert parsed.action.dtype == message.action.dtype
        case Reset():
            assert parse_request(decoded, framing) == message
        case _:
            parsed = parse_reply(decoded, framing, 1)
            if isinstance(message, Observation):
                assert isinstance(parsed, Observation)
                np.testing.assert_array_equal(parsed.observation["state"], message.observation["state"])
                assert (parsed.reward.tolist(), parsed.status) == ([1.0], ["running"])
            else:
                assert parsed == message


def test_the_doc_names_the_current_version_and_every_message_type() -> None:
    text = DOC.read_text()
    assert f"version {PROTOCOL_VERSION}" in text.splitlines()[0]
    for kind in MessageType:
        assert f"`{kind.value}`" in text
    for phase in Phase:
        assert f"| `{phase.value}` |" in text


def test_every_version_number_the_text_gives_is_the_protocols() -> None:
    """The prose, the tables and the decoded examples say the version the frames carry (a server written from
    the text alone must speak it)."""
    text = DOC.read_text()
    said = re.findall(
        r"protocol, version (\d+)|\"protocol\": (\d+)|hud-pipelines/(\d+)|\| `protocol` \| int \| `(\d+)`|"
        r"`protocol` is not (\d+)|positive fixint (\d+) \|",
        text,
    )
    versions = [int(next(v for v in found if v)) for found in said]
    assert len(versions) >= 9, versions
    assert set(versions) == {PROTOCOL_VERSION}
