"""The chat's model picker in the header (static/chat/model-picker.js): the operator's
allowed models (the browser tests' server allows fake-chat and fake-summary), the choice kept
per chat and used by the next send; English and Chinese, desktop and 390 px."""

from __future__ import annotations

from typing import Any

import pytest

from chat.models import ChatSession
from tests.browser.conftest import LiveApp, login
from tests.browser.test_chat_page import wait_js
from tests.browser.variants import VARIANT_IDS, VARIANTS, Variant, doc_screenshot, variant_page


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_pick_a_model_for_this_chat(
    browser: Any, app: LiveApp, user: Any, variant: Variant
) -> None:
    session = ChatSession.objects.create(owner=user, title="Models")
    other = ChatSession.objects.create(owner=user, title="Other")
    with variant_page(browser, variant) as page:
        login(page, app, user, next_path=f"/chat/{session.pk}/")
        wait_js(page, "document.documentElement.dataset.socket === 'open'", timeout=10_000)
        picker = page.locator("#model-select")
        if variant.phone:  # in the header's overflow menu there, with the other tools
            page.click("#more-btn")
        assert picker.is_visible()
        options = picker.locator("option").all_inner_texts()
        default = "默认（fake-chat）" if variant.chinese else "Default (fake-chat)"
        assert options == [default, "fake-chat", "fake-summary"]
        # Its name, for a screen reader, is the (visually hidden) label.
        label = "本对话使用的模型" if variant.chinese else "Model for this chat"
        assert page.get_by_label(label).count() == 1
        box = picker.bounding_box()
        assert box is not None and box["x"] + box["width"] <= variant.width
        if variant.phone:
            assert box["height"] >= 44
        picker.select_option("fake-summary")
        wait_js(page, "!document.getElementById('model-select').disabled")
        wait_js(page, "!document.getElementById('notice').hidden")
        assert "fake-summary" in page.locator("#notice").inner_text()
        assert ChatSession.objects.get(pk=session.pk).model == "fake-summary"

        app.fake.script({"content": "Answered by the summary model.", "token_ms": 2})
        page.fill("#composer-input", "Which model?")
        page.press("#composer-input", "Enter")
        page.wait_for_selector('[data-role="assistant"][data-status="complete"]')
        assert app.fake.calls[-1].body["model"] == "fake-summary"
        if variant == VARIANTS[0]:
            doc_screenshot(page, "model-picker")

        # Per chat: another chat keeps the default; back here the choice is shown again.
        page.goto(f"{app.url}/chat/{other.pk}/")
        page.wait_for_selector("#model-select option", state="attached")
        assert page.input_value("#model-select") == ""
        page.goto(f"{app.url}/chat/{session.pk}/")
        page.wait_for_selector("#model-select option", state="attached")
        assert page.input_value("#model-select") == "fake-summary"
