"""A reply's formatting in Chromium (chat/rendering.py + static/chat/codeblocks.js): coloured
code with a language label, a Copy button and a keyboard-reachable scroll region, MathML with
its TeX source, aligned tables, task lists, linked bare URLs, code as large as the text; the
stored reply and the streamed one alike; English and Chinese, desktop and 390 px."""

from __future__ import annotations

from typing import Any

import pytest

from chat.models import ChatMessage, ChatSession, MessageRole
from tests.browser.conftest import LiveApp, login
from tests.browser.test_chat_page import wait_js
from tests.browser.variants import VARIANT_IDS, VARIANTS, Variant, doc_screenshot, variant_page

REPLY = r"""Here is the plan, see https://example.org/docs for more.

```python
def area(r):  # a circle
    return 3.14159 * r ** 2 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0
```

The area is $A = \pi r^2$ and a thin space: $a\,b$.

$$
\int_0^1 x\,dx = \frac{1}{2}
$$

| item | qty | price |
|:-----|:---:|------:|
| tea  | 2   | 3.50  |

- [x] boil water
- [ ] pour
"""


def _open(page: Any, app: LiveApp, user: Any) -> int:
    session = ChatSession.objects.create(owner=user, title="Formatting")
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="Show me")
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content=REPLY)
    ChatSession.objects.filter(pk=session.pk).update(message_count=2)
    login(page, app, user, next_path=f"/chat/{session.pk}/")
    page.wait_for_selector("[data-role=assistant] .code-block")
    return session.pk


def _check_formatting(page: Any, variant: Variant, reply: Any) -> None:
    block = reply.locator(".code-block").first
    assert block.locator(".code-lang").inner_text() == "python"
    copy = block.locator(".code-copy")
    expected_name = "复制代码（python）" if variant.chinese else "Copy code (python)"
    assert copy.get_attribute("aria-label") == expected_name
    pre = block.locator("pre")
    assert pre.get_attribute("tabindex") == "0" and pre.get_attribute("role") == "region"
    region = "代码：python" if variant.chinese else "Code: python"
    assert pre.get_attribute("aria-label") == region
    # Coloured: a keyword is not the colour of a name.
    colours = pre.evaluate(
        "p => [getComputedStyle(p.querySelector('.hl-k')).color,"
        " getComputedStyle(p.querySelector('.hl-nf')).color]"
    )
    assert colours[0] != colours[1]
    # Code text as large as the body text.
    sizes = reply.evaluate(
        "r => [getComputedStyle(r.querySelector('.msg-body p')).fontSize,"
        " getComputedStyle(r.querySelector('pre code')).fontSize]"
    )
    assert sizes[0] == sizes[1], sizes
    # Math: drawn as MathML (it has a size), the TeX kept with its backslash.
    math = reply.locator(".math-inline math").nth(1)
    assert math.bounding_box()["width"] > 5
    assert math.locator("annotation").text_content() == "a\\,b"
    assert reply.locator(".math-block math[display=block]").count() == 1
    aligns = reply.evaluate(
        "r => [...r.querySelectorAll('thead th')].map(th => getComputedStyle(th).textAlign)"
    )
    assert aligns == ["left", "center", "right"]
    boxes = reply.locator("input.task-list-item-checkbox")
    assert boxes.count() == 2 and boxes.nth(0).is_checked() and not boxes.nth(1).is_checked()
    assert boxes.nth(0).is_disabled()
    assert reply.locator("a[href='https://example.org/docs']").count() == 1
    assert page.evaluate("window.__cspViolations") == []


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_stored_reply_is_formatted(browser: Any, app: LiveApp, user: Any, variant: Variant) -> None:
    with variant_page(browser, variant) as page:
        _open(page, app, user)
        reply = page.locator("[data-role=assistant]").last
        _check_formatting(page, variant, reply)
        # The scroll region is reachable by keyboard: Tab from the Copy button lands on it.
        copy = reply.locator(".code-copy").first
        copy.focus()
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.tagName") == "PRE"
        # Copy puts the code, exactly, on the clipboard.
        copy.click()
        wait_js(page, "navigator.clipboard !== undefined")
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied.startswith("def area(r):  # a circle\n")
        assert copy.inner_text() == ("已复制" if variant.chinese else "Copied")
        if variant == VARIANTS[0]:
            reply.scroll_into_view_if_needed()
            doc_screenshot(page, "formatted-reply")


@pytest.mark.parametrize("variant", VARIANTS[::3], ids=VARIANT_IDS[::3])
def test_streamed_reply_ends_formatted_the_same_way(
    browser: Any, app: LiveApp, user: Any, variant: Variant
) -> None:
    with variant_page(browser, variant) as page:
        _open(page, app, user)
        wait_js(page, "document.documentElement.dataset.socket === 'open'", timeout=10_000)
        app.fake.script({"content": REPLY, "token_ms": 2})
        page.fill("#composer-input", "Again")
        page.press("#composer-input", "Enter")
        page.wait_for_selector("[data-role=assistant] >> nth=1")
        wait_js(
            page,
            "document.querySelectorAll('[data-role=assistant][data-status=complete] .code-block')"
            ".length === 2",
            timeout=20_000,
        )
        _check_formatting(page, variant, page.locator("[data-role=assistant]").last)
