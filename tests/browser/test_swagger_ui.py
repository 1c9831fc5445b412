"""Swagger UI (``/v2/docs``, ``/v2/models/{name}/docs``) opened in headless Chromium and
used as a person would: an operation expanded, "Try it out", "Execute"; the answer read
from the page's response panel and found in the server's access log, so the request went
from the page to this server. Every file the page loaded came from the server itself
(nothing from a CDN: the page works offline).

Chromium and chromedriver come from Debian (scripts/install_browser.sh); selenium is
pointed at /usr/bin/chromedriver (``INFERPOOL_CHROMEDRIVER`` to change it), so nothing is
downloaded."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Server, write_custom_model

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMEDRIVER = os.environ.get("INFERPOOL_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Generous: the page parses a 1 MB script on a loaded two-core machine.
WAIT = 90

SOURCE = """
import numpy as np

import inferpool


class Total(inferpool.Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        return {outputs[0]: np.asarray(payload).sum(axis=1)}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("browser")
    write_custom_model(
        root / "total",
        SOURCE,
        "Total",
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        outputs=[{"name": "sum", "datatype": "FP32", "shape": [-1]}],
    )
    with Server(root, "--workers", "1", "--access-log") as running:
        running.wait_ready(120)
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    assert Path(CHROMEDRIVER).is_file(), f"{CHROMEDRIVER} missing: sh scripts/install_browser.sh"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def execute(driver: WebDriver, operation: str) -> tuple[str, str]:
    """Expand ``operation`` (its element id), press "Try it out" then "Execute"; the
    status and the body the response panel shows."""
    wait = WebDriverWait(driver, WAIT)
    block: WebElement = wait.until(ec.presence_of_element_located((By.ID, operation)))
    block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    scope = f"#{operation}"
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, f"{scope} .try-out__btn"))).click()
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, f"{scope} .execute"))).click()
    panel = f"{scope} .live-responses-table tbody .response"
    status = wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, f"{panel} .response-col_status"))
    )
    body = driver.find_element(By.CSS_SELECTOR, f"{panel} .response-col_description pre")
    return status.text.strip(), body.text


def loaded_from(driver: WebDriver) -> set[str]:
    """The origins of every file the page loaded."""
    urls = driver.execute_script(
        "return [location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"
    )
    return {"/".join(url.split("/")[:3]) for url in urls}


def test_the_server_page_sends_a_readiness_request(server, browser):
    browser.get(server.url + "/v2/docs")
    status, body = execute(browser, "operations-health-get_v2_health_ready")
    assert status == "200"
    assert '"ready": true' in body
    server.expect_lines([r"GET /v2/health/ready peer=\S+ .*status=200"], timeout=30)
    assert loaded_from(browser) == {server.url}


def test_a_model_page_sends_its_example_inference(server, browser):
    browser.get(server.url + "/v2/models/total/docs")
    status, body = execute(browser, "operations-inference-post_v2_models_total_infer")
    assert status == "200", body
    assert '"model_name": "total"' in body and '"name": "sum"' in body
    server.expect_lines(
        [r"POST /v2/models/total/infer peer=\S+ model=total .*status=200"], timeout=30
    )
    assert loaded_from(browser) == {server.url}
