"""The four ways issue 27's page tests look at a page: English and Chinese, desktop and a
390 px phone; a page per variant with the XSS/CSP trap, JS errors collected, and (for the
code blocks' Copy button) the clipboard allowed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.browser.conftest import XSS_TRAP

ROOT = Path(__file__).resolve().parents[2]
DOC_SCREENSHOTS = ROOT / "docs" / "screenshots"


@dataclass(frozen=True)
class Variant:
    locale: str
    width: int
    height: int

    @property
    def chinese(self) -> bool:
        return self.locale.startswith("zh")

    @property
    def phone(self) -> bool:
        return self.width < 600

    def __str__(self) -> str:
        return f"{self.locale}-{self.width}"


VARIANTS = [
    Variant("en-US", 1280, 800),
    Variant("en-US", 390, 844),
    Variant("zh-CN", 1280, 800),
    Variant("zh-CN", 390, 844),
]
VARIANT_IDS = [str(v) for v in VARIANTS]


@contextmanager
def variant_page(browser: Any, variant: Variant, *, bypass_csp: bool = False) -> Iterator[Any]:
    """`bypass_csp` only for axe-core, whose script the test injects into the page."""
    options: dict[str, Any] = {
        "viewport": {"width": variant.width, "height": variant.height},
        "locale": variant.locale,
        "extra_http_headers": {"Accept-Language": "zh-hans" if variant.chinese else "en"},
        "permissions": ["clipboard-read", "clipboard-write"],
        "bypass_csp": bypass_csp,
    }
    if variant.phone:
        options.update(has_touch=True, is_mobile=True)
    context = browser.new_context(**options)
    context.add_init_script(XSS_TRAP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
        assert not errors, f"JavaScript errors on the page: {errors}"
        assert page.evaluate("window.__xss") == 0
    finally:
        context.close()


def doc_screenshot(page: Any, name: str) -> None:
    """The README's pictures (docs/screenshots/), rewritten only when asked:
    `UPDATE_DOC_SCREENSHOTS=1 pytest tests/browser/...`; otherwise into artifacts/."""
    if os.environ.get("UPDATE_DOC_SCREENSHOTS") == "1":
        DOC_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOC_SCREENSHOTS / f"{name}.png"))
    else:
        target = ROOT / "artifacts" / "screenshots"
        target.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target / f"{name}.png"))
