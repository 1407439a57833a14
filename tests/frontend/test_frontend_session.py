"""QwenOutputSession protocol details: preview/commit/finish, stop ids, EOS, held tokens."""
from __future__ import annotations

import pytest
from conftest import WEATHER_TOOL
from frontend_stream_util import run_chunks

from ninfer.errors import InvalidInput
from ninfer.runtime.contract.output import OutputSession

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def plain(frontend):
    return frontend.prepare_chat(USER)  # thinking off, no tools


def enc(frontend, text):
    return frontend.tokenizer.encode(text)


def test_implements_the_runtime_protocol(frontend, plain):
    assert isinstance(frontend.new_session(plain), OutputSession)


def test_preview_without_commit_leaves_state_unchanged(frontend, plain):
    session = frontend.new_session(plain, stop=["END"])
    first = enc(frontend, "Hello 🦜")
    session.commit(session.preview(first[:2], [0.0, 0.0]))
    before = session.message()
    for decoy in (enc(frontend, " END"), [frontend.tokenizer.special.im_end], first[2:3]):
        preview = session.preview(decoy, [0.0] * len(decoy))
        assert session.message() == before
        assert not session.finished
    rest = first[2:] + [frontend.tokenizer.special.im_end]
    got = run_chunks(session, rest, [1] * len(rest))
    assert session.message().content == "Hello 🦜" and got.finish_reason == "stop"
    with pytest.raises(RuntimeError):
        session.commit(preview)  # stale: the session moved on


def test_commit_twice_is_refused(frontend, plain):
    session = frontend.new_session(plain)
    preview = session.preview(enc(frontend, "a"), [0.0])
    session.commit(preview)
    with pytest.raises(RuntimeError):
        session.commit(preview)


def test_stop_token_mid_preview(frontend, plain):
    session = frontend.new_session(plain)
    ids = enc(frontend, "Yes.") + [frontend.tokenizer.special.im_end] + enc(frontend, "junk")
    preview = session.preview(ids, [-0.5] * len(ids))
    n = len(enc(frontend, "Yes.")) + 1
    assert (preview.accepted, preview.finish_reason) == (n, "stop")
    delta = session.commit(preview)
    assert delta.content == "Yes." and delta.finish_reason == "stop"
    assert delta.token_ids == tuple(ids[:n]) and delta.logprobs == (-0.5,) * n
    assert session.finished and session.finish("length") is None
    with pytest.raises(RuntimeError):
        session.preview(ids, [0.0] * len(ids))


def test_stop_string_accepts_up_to_the_completing_token(frontend, plain):
    session = frontend.new_session(plain, stop=["lazy dog"])
    ids = enc(frontend, "the quick lazy dog jumps")
    preview = session.preview(ids, [0.0] * len(ids))
    text_upto = frontend.tokenizer.decode(ids[: preview.accepted])
    assert text_upto.endswith("lazy dog") and preview.finish_reason == "stop"
    assert session.commit(preview).content == "the quick "


def test_ignore_eos_and_request_stop_ids(frontend, plain):
    im_end, eot = frontend.tokenizer.special.im_end, frontend.tokenizer.special.endoftext
    ids = enc(frontend, "a") + [im_end] + enc(frontend, "b") + [eot] + enc(frontend, "c")
    got = run_chunks(frontend.new_session(plain, ignore_eos=True), ids, [len(ids)])
    assert (got.content, got.finish_reason) == ("abc", "length")
    raw = run_chunks(frontend.new_session(plain, ignore_eos=True, skip_special_tokens=False),
                     ids, [len(ids)])
    assert raw.content == "a<|im_end|>b<|endoftext|>c"
    b = enc(frontend, "b")[0]
    stopped = run_chunks(frontend.new_session(plain, ignore_eos=True, stop_token_ids=[b]),
                         ids, [1] * len(ids))
    assert (stopped.content, stopped.finish_reason) == ("a", "stop")
    with pytest.raises(InvalidInput):
        frontend.new_session(plain, stop_token_ids=[-3])


def test_finish_flushes_held_text(frontend, plain):
    session = frontend.new_session(plain, stop=["STOP"])
    ids = enc(frontend, "abc ST")
    assert run_chunks(session, ids, [1] * len(ids)).content == "abc ST"
    session = frontend.new_session(plain)
    parrot = enc(frontend, "🦜")
    assert session.commit(session.preview(parrot[:1], [0.0])) is None  # nothing visible yet
    final = session.finish("length")
    assert final.content == "\ufffd" and final.token_ids == tuple(parrot[:1])
    assert final.finish_reason == "length"


def test_held_tokens_ride_on_the_next_delta(frontend, plain):
    session = frontend.new_session(plain)
    parrot = enc(frontend, "🦜!")
    deltas = [session.commit(session.preview([t], [float(i)])) for i, t in enumerate(parrot)]
    assert deltas[:-2] == [None] * (len(parrot) - 2)
    assert deltas[-2].content == "🦜" and deltas[-2].token_ids == tuple(parrot[:-1])
    assert deltas[-2].logprobs == tuple(float(i) for i in range(len(parrot) - 1))


def test_tool_calls_finish_reason(frontend):
    prepared = frontend.prepare_chat(USER, tools=[WEATHER_TOOL])
    call = enc(frontend, "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
                         "</parameter>\n</function>\n</tool_call>")
    stopped = run_chunks(frontend.new_session(prepared), call + [248046], [3] * len(call))
    assert stopped.finish_reason == "tool_calls"
    cut = run_chunks(frontend.new_session(prepared), call, [3] * len(call), end_reason="length")
    assert cut.finish_reason == "length" and cut.parsed_calls() == [("get_weather", {"city": "Oslo"})]
    text = run_chunks(frontend.new_session(prepared), enc(frontend, "plain") + [248046], [1, 1, 1])
    assert text.finish_reason == "stop"


def test_forced_prefix_is_published_with_the_first_delta(frontend):
    prepared = frontend.prepare_chat(
        USER, tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    session = frontend.new_session(prepared, call_id_prefix="q")
    delta = session.commit(session.preview(enc(frontend, "<"), [0.0]))
    assert delta.tool_calls[0].id == "call_q0" and delta.tool_calls[0].name == "get_weather"
    assert frontend.new_session(prepared).message().tool_calls == ()  # not before a commit
