"""The text is built where it is sent (soakd/workload/build.py): a worker, given what the
HELLO and the CALIBRATE frames carry, builds the same body bytes as soakd's own process."""

from __future__ import annotations

import json
from dataclasses import replace

from soakd.config import Conversations, TargetConfig, TokenLength, TurnCount, Workload
from soakd.model import RequestSpec
from soakd.targets.openai import open_target
from soakd.workers import wire
from soakd.workload.build import Builder
from soakd.workload.calibration import Calibration

CAL = Calibration("tokenize", "a", tuple(1 + i % 3 for i in range(1024)), 1.0, 4.0, 0)
LATER = Calibration("usage", "a", None, 1.3, 2.0, 5)


def through_hello(wl: Workload, cals: list[Calibration]) -> Builder:
    """A worker's builder: the workload and calibrations as JSON frames carry them."""
    hello = json.loads(
        json.dumps(
            {
                "workload": wl.model_dump(mode="json"),
                "calibrations": [wire.calibration_doc(c) for c in cals],
            }
        )
    )
    return Builder(
        Workload.model_validate(hello["workload"]),
        [wire.read_calibration(c) for c in hello["calibrations"]],
    )


def spec(seq: int, **more: object) -> RequestSpec:
    return replace(RequestSpec("t", "p", seq, "", 0, 16, 0.7, 0), **more)  # type: ignore[arg-type]


async def bodies(builder: Builder, specs: list[RequestSpec], api: str = "chat") -> list[bytes]:
    cfg = TargetConfig(name="t", base_url="http://127.0.0.1:9", model="m", api=api)  # type: ignore[arg-type]
    target = await open_target(cfg, builder=builder)
    try:
        return [target.body(s) for s in specs]
    finally:
        await target.aclose()


async def test_a_worker_builds_the_same_bytes_as_this_process() -> None:
    wl = Workload(seed=3, prompts={"input_tokens": TokenLength(dist="uniform", min=4, max=300)})  # type: ignore[arg-type]
    here = Builder(wl)
    here.calibrate(CAL)
    worker = through_hello(wl, [CAL])
    specs = [spec(seq) for seq in range(12)]
    for api in ("chat", "completions"):
        mine = await bodies(here, specs, api)
        assert mine == await bodies(worker, specs, api)
        assert len(set(mine)) == len(mine)  # a prompt per seq, none empty
    # a correction from seq 5 on, as CALIBRATE carries it: the same bytes again, the seqs
    # before it as they were
    before = await bodies(here, specs)
    here.calibrate(LATER)
    worker.calibrate(wire.read_calibration(json.loads(json.dumps(wire.calibration_doc(LATER)))))
    after = await bodies(here, specs)
    assert after == await bodies(worker, specs)
    assert after[:5] == before[:5]
    assert after[5:] != before[5:]


async def test_a_conversation_turn_is_built_alike_from_its_history() -> None:
    wl = Workload(
        seed=1,
        conversations=Conversations(turns=TurnCount(mean=3), user_tokens=TokenLength(mean=20)),
    )
    here, worker = Builder(wl, [CAL]), through_hello(wl, [CAL])
    turn = spec(9, conversation=4, turn=2, history=("first answer", "séconde ✓"))
    buf = bytearray()
    wire.pack_spec(buf, 1, 0, turn)
    ((_, _, got),) = wire.unpack_specs(bytes(buf), ["t"])
    (mine,) = await bodies(here, [turn])
    assert mine == (await bodies(worker, [got]))[0]
    messages = json.loads(mine)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in messages[1::2]] == ["first answer", "séconde ✓"]
