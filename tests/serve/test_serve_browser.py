"""The page in a real browser: Debian's chromium, headless, driven by Selenium through Debian's
chromedriver (nothing is downloaded).  It opens the page of a real `vitkit serve --token` process,
gives the token, uploads an image and waits for the top class, the bars and the attention overlay.

Skipped where chromium or chromedriver is missing; to run it on Debian/Ubuntu:
    apt-get install -y chromium chromium-driver
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="the serve tests need httpx (in the test extra)")

from serve_helpers import start_server, stop_server  # noqa: E402 - after the skips

from vitkit.eval.predict import PredictConfig, predict_files  # noqa: E402
from vitkit.runs import open_checkpoint  # noqa: E402

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,760",
)


def chromium_driver(profile: Path):
    """A Selenium driver of the system chromium with a fresh profile, or a skip saying how to install one."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip(
            "no chromium + chromedriver on this machine; install them with "
            "`apt-get install -y chromium chromium-driver` to run the browser test"
        )
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is in the test extra: pip install -e '.[test]'"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def test_the_page_shows_the_top_class_bars_and_overlay(
    vit_checkpoint: Path, images: list[Path], tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never try to download a driver
    image = images[0]
    expected = predict_files(open_checkpoint(vit_checkpoint), [image], PredictConfig(top_k=5))[0]["predictions"]
    browser = chromium_driver(tmp_path / "profile")  # skips here when there is no browser or no selenium
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    process, url = start_server(vit_checkpoint, tmp_path / "server.log", "--token", "s3cret", token="s3cret")
    try:
        browser.get(f"{url}/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda b: b.find_element(By.ID, "token-box").is_displayed())  # /health said 401
        browser.find_element(By.ID, "token").send_keys("s3cret")
        browser.find_element(By.ID, "token-save").click()
        wait.until(lambda b: b.find_element(By.ID, "status").text == "Ready.")
        assert not browser.find_element(By.ID, "token-box").is_displayed()
        assert "VisionTransformer" in browser.find_element(By.ID, "model").text
        browser.find_element(By.ID, "file").send_keys(str(image))
        wait.until(lambda b: b.find_element(By.ID, "top-class").text != "")
        wait.until(lambda b: b.execute_script("return document.getElementById('overlay').naturalWidth") > 0)
        assert browser.find_element(By.ID, "top-class").text == expected[0]["class"]
        labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#bars .label")]
        values = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#bars .value")]
        assert labels == [p["class"] for p in expected]  # 3 classes: all of them, most probable first
        assert values == [f"{100 * p['probability']:.1f}%" for p in expected]
        assert browser.execute_script("return document.getElementById('overlay').naturalWidth") == 224
        assert (
            browser.find_element(By.ID, "overlay").is_displayed()
            and browser.find_element(By.ID, "input").is_displayed()
        )
        assert "4\u00d74 patch grid" in browser.find_element(By.ID, "overlay-note").text
    finally:
        browser.quit()
        assert stop_server(process) == 0
