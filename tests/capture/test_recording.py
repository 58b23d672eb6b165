"""The recording's file (requests.jsonl) as the proxy writes it and the replay reads it, the replay's plan, and the
delta debugging that --shrink runs on real servers (here with predicates whose answer is known)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtrace.capture.recording import (
    AnswerReader,
    RecordedRequest,
    RecordingError,
    RecordWriter,
    parse_body,
    read_records,
)
from kvtrace.capture.replay import plan
from kvtrace.capture.shrink import ddmin, shrink, turns, with_turns


def rec(i: int, start: float, end: float, **kw: object) -> RecordedRequest:
    return RecordedRequest(id=i, method="POST", path="/v1/chat/completions", headers={}, body={"n": i},
                           start=start, end=end, **kw)  # type: ignore[arg-type]


def write(path: Path, records: list[RecordedRequest]) -> Path:
    w = RecordWriter(path)
    for r in records:
        w.write(r)
    w.close()
    return path


def test_a_written_recording_reads_back_the_same(tmp_path: Path) -> None:
    records = [rec(0, 1.0, 2.0, stream=True, events=5), rec(1, 1.5, 3.0, cancelled=True, cancelled_at=2.5)]
    assert read_records(write(tmp_path / "r.jsonl", records)) == records


def test_keys_are_never_kept_in_a_body() -> None:
    body, b64 = parse_body(b'{"model": "m", "api_key": "sk-1", "extra": {"Authorization": "Bearer x"}}',
                           "application/json")
    assert b64 is None and body == {"model": "m", "extra": {}}


@pytest.mark.parametrize(("edit", "said"), [
    (lambda text: text[:-30], "line 2: the line is cut short"),
    (lambda text: text.replace('"method":"POST"', '"method":7', 1), "line 1: `method` is 7"),
    (lambda text: text.replace('"path":"/v1/chat/completions"', '"path":"v1"', 1), "does not start with /"),
    (lambda text: text.replace('"id":1', '"id":0'), "ids repeat"),
    (lambda text: "", "no requests in it"),
    (lambda text: "{not json\n", "line 1: not JSON"),
])
def test_a_cut_or_edited_recording_is_one_clear_error(tmp_path: Path, edit, said: str) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path / "r.jsonl", [rec(0, 1.0, 2.0), rec(1, 2.0, 3.0)])
    path.write_text(edit(path.read_text()))
    with pytest.raises(RecordingError, match=None) as err:
        read_records(path)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_the_answer_reader_follows_a_stream_split_anywhere() -> None:
    events = [{"choices": [{"delta": {"content": w}}]} for w in ("the ", "draft")]
    events.append({"choices": [{"delta": {}, "finish_reason": "length"}], "timings": {"predicted_n": 2}})
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    reader = AnswerReader(streamed=True, keep_text=True)
    n = sum(reader.feed(stream[i:i + 7]) for i in range(0, len(stream), 7))
    reader.close()
    assert n == 4 and reader.full_text() == "the draft" and reader.finish_reason == "length"
    assert reader.timings == {"predicted_n": 2} and reader.first_token_seen


def test_the_plan_keeps_order_overlap_and_what_each_request_waited_for() -> None:
    steps = plan([rec(0, 10.0, 11.0), rec(1, 12.0, 14.0), rec(2, 12.5, 13.0), rec(3, 14.5, 15.0),
                  rec(4, 9.0, 9.5, reached_server=False)])
    assert [s.record.id for s in steps] == [0, 1, 2, 3]  # the one that never reached the server is not sent
    assert [s.after for s in steps] == [[], [0], [0], [0, 1, 2]]  # 1 and 2 overlapped; 3 followed both
    assert [round(s.gap, 3) for s in steps] == [0.0, 1.0, 1.5, 0.5]


def test_ddmin_finds_the_one_trigger_and_the_pair() -> None:
    items = list(range(20))
    asked: list[list[int]] = []

    def fails(xs: list[int]) -> bool:
        asked.append(xs)
        return 13 in xs

    assert ddmin(items, fails) == [13] and len(asked) < 20
    assert ddmin(items, lambda xs: 3 in xs and 17 in xs) == [3, 17]


def test_shrink_cuts_whole_earlier_turns_and_counts_its_runs() -> None:
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                         {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
                         {"role": "assistant", "content": "d"}, {"role": "user", "content": "trigger"}]}
    assert turns(body) == ([0], [[1, 2], [3, 4], [5]])
    records = [rec(i, float(i), i + 0.5) for i in range(6)]
    records[1].method = "GET"  # a poll: left out in one run
    records[4] = RecordedRequest(id=4, method="POST", path="/v1/chat/completions", headers={}, body=body,
                                 start=4.0, end=4.5)
    result = shrink(records, lambda xs: any("trigger" in json.dumps(r.body) for r in xs), max_runs=40)
    assert result.complete and [r.id for r in result.records] == [4]
    assert [m["content"] for m in result.records[0].body["messages"]] == ["s", "trigger"]
    assert with_turns(records[4], [1, 2]).body["messages"][1]["content"] == "c"
    short = shrink(records, lambda xs: any("trigger" in json.dumps(r.body) for r in xs), max_runs=3)
    assert not short.complete and short.runs == 3


def test_the_answer_reader_reads_events_that_are_not_one_json_line() -> None:
    """The answer is decoded at its end in one go; an event that is no JSON (a comment, a note of a proxy), or data
    over two lines, is read one event at a time instead, with the same result."""
    first = {"choices": [{"delta": {"content": "the "}}]}
    events = [b"data: " + json.dumps(first).encode(), b": a comment line", b"data: not json",
              b'data: {"choices": [{"delta":\ndata:  {"content": "draft"}}]}',
              b"data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}],
                                      "timings": {"predicted_n": 2}}).encode(), b"data: [DONE]"]
    reader = AnswerReader(streamed=True, keep_text=True)
    assert reader.feed(b"\n\n".join(events) + b"\n\n") == 6
    assert reader.whole
    reader.close()
    assert reader.full_text() == "the draft" and reader.timings == {"predicted_n": 2}
    assert reader.finish_reason == "stop"
