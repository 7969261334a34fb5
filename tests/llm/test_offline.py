"""The offline provider: a fresh install with no LLM_BASE_URL must still answer and summarise."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chat.llm import get_provider, provider_info
from chat.llm.base import SUMMARY_MARKER
from chat.llm.offline import RUNES_PER_TOKEN, OfflineProvider, extractive_summary

CHAT = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Can you book a table for two?"},
]

CONVERSATION = [
    {"role": "system", "content": f"{SUMMARY_MARKER} Merge these turns into the summary."},
    {
        "role": "user",
        "content": (
            "Please deploy the app to https://example.com/app today. Use port 8443 and the "
            "config at /etc/cadau/config.json. Alice Smith approved it."
        ),
    },
    {"role": "assistant", "content": "Done. Version 1.4.2 is live since 14:30.\nBuild: 42s."},
    {"role": "user", "content": "请把报告保存到 /srv/reports/2024.md。预算是 3000 元。"},
]


def test_empty_base_url_selects_the_offline_provider(settings):
    settings.LLM_BASE_URL = ""
    provider = get_provider()
    assert isinstance(provider, OfflineProvider)
    assert provider.is_offline and provider.name == "offline"
    assert provider_info() == {
        "name": "offline",
        "model": "offline",
        "summary_model": "offline",
        "offline": True,
        "base_url": "",
    }


def test_reply_says_how_to_configure_a_model_and_acknowledges_the_message():
    text = OfflineProvider().complete(messages=CHAT).text
    for name in ("LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL"):
        assert name in text
    assert "no language model is configured" in text
    assert "Can you book a table for two?" in text


async def test_reply_streams_word_by_word():
    events = [e async for e in OfflineProvider().astream_chat(messages=CHAT)]
    deltas, done = events[:-1], events[-1]
    assert len(deltas) > 20 and all(e.kind == "delta" for e in deltas)
    assert done.kind == "done" and done.finish_reason == "stop"
    assert "".join(e.text for e in deltas) == done.text
    assert "LLM_BASE_URL" in done.text


def test_summary_is_extractive_and_keeps_numbers_paths_urls_names():
    text = OfflineProvider().complete(messages=CONVERSATION, max_tokens=200).text
    for fact in (
        "https://example.com/app",
        "8443",
        "/etc/cadau/config.json",
        "Alice Smith",
        "1.4.2",
        "14:30",
        "/srv/reports/2024.md",
        "3000",
    ):
        assert fact in text, fact
    assert "Merge these turns" not in text  # instructions are not conversation
    assert "no language model" not in text
    # Extractive: every bullet starts with words that occur in the input.
    source = " ".join(str(m["content"]) for m in CONVERSATION)
    for line in text.splitlines():
        first_words = line.removeprefix("- ").split(": ", 1)[-1][:5]
        assert first_words in source


def test_summary_is_deterministic():
    provider = OfflineProvider()
    runs = {provider.complete(messages=CONVERSATION, max_runes=150).text for _ in range(3)}
    assert len(runs) == 1


def test_summary_respects_max_tokens_and_max_runes():
    provider = OfflineProvider()
    by_tokens = provider.complete(messages=CONVERSATION, max_tokens=30).text
    assert 0 < len(by_tokens) <= 30 * RUNES_PER_TOKEN
    by_runes = provider.complete(messages=CONVERSATION, max_runes=60, max_tokens=1000).text
    assert 0 < len(by_runes) <= 60


def test_summary_keeps_both_ends_of_a_long_history():
    messages = [{"role": "system", "content": SUMMARY_MARKER}] + [
        {"role": "user", "content": f"Step {i} finished. Details follow for step {i}."}
        for i in range(200)
    ]
    text = extractive_summary(messages, max_runes=800)
    assert len(text) <= 800
    assert "Step 0 finished." in text and "Step 199 finished." in text


def test_plainly_worded_summary_prompts_are_summaries_too():
    messages = [{"role": "system", "content": "Summarize the conversation so far."}, *CHAT[1:]]
    text = OfflineProvider().complete(messages=messages).text
    assert text == "- user: Can you book a table for two?"


def test_empty_input_gives_an_empty_summary():
    assert extractive_summary([{"role": "system", "content": SUMMARY_MARKER}], max_runes=99) == ""


@hsettings(max_examples=60, deadline=None)
@given(
    contents=st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=12),
    cap=st.integers(min_value=0, max_value=400),
)
def test_summary_never_exceeds_the_cap(contents, cap):
    messages = [{"role": "user", "content": c} for c in contents]
    text = extractive_summary(messages, max_runes=cap)
    assert len(text) <= cap
    assert text == extractive_summary(messages, max_runes=cap)


def test_summary_obeys_the_length_the_prompt_asks_for():
    messages = [
        *CONVERSATION[:-1],
        {
            "role": "user",
            "content": CONVERSATION[-1]["content"] + " Reply in at most 90 characters.",
        },
    ]
    text = OfflineProvider().complete(messages=messages, max_tokens=1000).text
    assert 0 < len(text) <= 90
