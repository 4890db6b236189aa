"""A ShareGPT file's own conversations (``prompts.source: sharegpt`` with
``workload.conversations``): each conversation is a file item, its user turns and the
lengths of the answers the dataset gave them planned, the server's own answers in the
history; the config's synthetic keys refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from soakd.config import Config, Workload
from soakd.model import RequestSpec
from soakd.workload.build import Builder
from soakd.workload.conversations import DatasetConversations, make_conversations
from tests import dataset_files


def workload(path: Path, **conversations: Any) -> Workload:
    return Workload.model_validate(
        {
            "prompts": {"source": "sharegpt", "file": str(path)},
            "conversations": {"think_time": 0.25, **conversations},
        }
    )


def turn(conv: int, t: int, history: tuple[str, ...] = ()) -> RequestSpec:
    return RequestSpec("t", "p", 0, "", 0, 64, 0.0, 0, conversation=conv, turn=t, history=history)


def test_each_conversation_is_a_file_item_with_its_turns_and_planned_answers(
    tmp_path: Path,
) -> None:
    path = dataset_files.sharegpt(tmp_path / "s.json", n=3)
    builder = Builder(workload(path))
    plan = builder.conversations
    assert isinstance(plan, DatasetConversations)
    # every item: a system prompt, then two human turns each answered by gpt
    assert [plan.turns(c) for c in range(4)] == [2, 2, 2, 2]
    # the answers planned as long as the dataset's (4 characters a token): 10 + 3 i, then 7
    assert [plan.answer_tokens(c, 0) for c in range(3)] == [10, 13, 16]
    assert plan.answer_tokens(1, 1) == 7
    assert plan.think_s(1, 1) == 0.25
    first = builder.messages(turn(1, 0))
    second = builder.messages(turn(1, 1, ("the server's own answer",)))
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[0] == {"role": "system", "content": "You answer briefly."}
    assert second[1] == first[-1]  # the first turn, as it was sent
    assert second[2]["content"] == "the server's own answer"  # not the dataset's
    assert second[3]["content"] == "and then?"
    # cycled: conversation 4 is item 1 again, asked alike on every target and process
    assert builder.messages(turn(4, 0)) == first
    assert Builder(workload(path)).messages(turn(1, 0)) == first


def test_the_parent_and_the_senders_plan_the_same_conversations(tmp_path: Path) -> None:
    path = dataset_files.sharegpt(tmp_path / "s.json", n=3)
    parent = make_conversations(workload(path))
    sender = Builder(workload(path)).conversations
    assert parent is not None
    assert sender is not None
    for c in range(5):
        assert parent.turns(c) == sender.turns(c)
        for t in range(parent.turns(c)):
            assert parent.user(c, t) == sender.user(c, t)
            assert parent.answer_tokens(c, t) == sender.answer_tokens(c, t)


@pytest.mark.parametrize(
    ("source", "conversations", "why"),
    [
        ("sharegpt", {"turns": 3}, "workload.conversations.turns: the sharegpt file's"),
        ("sharegpt", {"user_tokens": {"mean": 9}}, "workload.conversations.user_tokens: the"),
        ("mooncake", {}, "prompts.source 'mooncake' is not used with them (sharegpt gives"),
    ],
)
def test_keys_a_dataset_gives_are_refused(
    tmp_path: Path, source: str, conversations: dict[str, Any], why: str
) -> None:
    path = dataset_files.sharegpt(tmp_path / "s.json", n=3)
    doc = {
        "targets": [{"name": "t", "simulator": "fast"}],
        "workload": {
            "prompts": {"source": source, "file": str(path)},
            "conversations": conversations,
        },
        "phases": [{"name": "p", "duration": "1s"}],
    }
    with pytest.raises(ValidationError) as exc:
        Config.model_validate(doc)
    assert why in str(exc.value)
