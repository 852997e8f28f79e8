"""A real browser for the console's tests: Debian's chromium, headless, driven by
Selenium through Debian's chromedriver.

A missing browser skips the tests locally and FAILS them in CI (``CI=true`` or
``JOBLEDGER_REQUIRE_SERVICES=1``), as a missing PostgreSQL or Kafka does: CI must never
pass a console it did not drive. ``.ci/run`` installs both packages when they are
missing. Every page a test looks at is saved as a screenshot under
``artifacts/console/<test>/`` (ignored by git; CI keeps it).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path(os.environ.get("JOBLEDGER_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("JOBLEDGER_TEST_CHROMEDRIVER", "/usr/bin/chromedriver"))
REQUIRED = os.environ.get("CI") == "true" or os.environ.get("JOBLEDGER_REQUIRE_SERVICES") == "1"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "console"
WAIT_SECONDS = 15


def chromium() -> Iterator[WebDriver]:
    """A headless chromium, or a skip (locally) / failure (in CI) naming what is missing."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        message = f"no browser for the console tests: {', '.join(missing)} missing"
        message += " (apt-get install chromium chromium-driver)"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    except WebDriverException as error:
        pytest.fail(f"chromium did not start: {error.msg}")
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The browser on the console of one server, saving a screenshot of each page."""

    def __init__(self, driver: WebDriver, base_url: str, test_name: str) -> None:
        self.driver = driver
        self.base = base_url
        self.shots = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", test_name)
        if self.shots.exists():
            shutil.rmtree(self.shots)
        self.shots.mkdir(parents=True)
        self.taken = 0

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def shot(self, name: str) -> Path:
        self.taken += 1
        path = self.shots / f"{self.taken:02d}-{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str = "main") -> str:
        # A live update can swap the element out between finding and reading it; Chrome
        # then says so in a plain WebDriverException, not a stale-element one.
        for _ in range(STALE_READS - 1):
            try:
                return self.find(css).text
            except WebDriverException as error:
                if not is_stale(error):
                    raise
        return self.find(css).text

    def wait(self, holds: Callable[[], object], what: str, seconds: float = WAIT_SECONDS) -> None:
        # A live page swaps its content in: an element read a moment ago may be gone.
        WebDriverWait(
            self.driver,
            seconds,
            poll_frequency=0.05,
            ignored_exceptions=(StaleElementReferenceException,),
        ).until(lambda _: holds(), message=f"waited {seconds} s for {what}")

    def sign_in(self, credential: str) -> None:
        self.open("/console/sign-in")
        self.find("#credential").send_keys(credential)
        self.find("#sign-in").click()
        self.wait(lambda: self.all("#subject"), "the signed-in page")

    def sign_out(self) -> None:
        self.find("form.who button").click()
        self.wait(lambda: self.all("#credential"), "the sign-in page")

    def severe_console_errors(self) -> list[str]:
        """What the browser logged at SEVERE: a CSP violation, a script error, a 404."""
        logs = self.driver.get_log("browser")  # type: ignore[no-untyped-call]
        return [entry["message"] for entry in logs if entry["level"] == "SEVERE"]


STALE_READS = 5


def is_stale(error: WebDriverException) -> bool:
    return isinstance(error, StaleElementReferenceException) or (
        "does not belong to the document" in (error.msg or "")
    )
