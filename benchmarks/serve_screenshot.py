"""Screenshot of the `vitkit serve` page after uploading one image (docs/serve.png in the README).

    .venv/bin/python benchmarks/serve_screenshot.py RUN_OR_CKPT IMAGE [--out docs/serve.png]

Starts `vitkit serve` on a free loopback port, opens the page in Debian's headless chromium through
Selenium and Debian's chromedriver (`apt-get install -y chromium chromium-driver`; nothing is
downloaded), uploads IMAGE, waits for the top class and the overlay, and saves the window as PNG.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("image")
    parser.add_argument("--out", default="docs/serve.png")
    parser.add_argument("--size", default="1100,780", help="window width,height in pixels")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "vitkit", "serve", args.checkpoint, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not download anything
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as profile:
            options = webdriver.ChromeOptions()
            options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
            for flag in (*FLAGS, f"--window-size={args.size}", f"--user-data-dir={profile}"):
                options.add_argument(flag)
            service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
            browser = webdriver.Chrome(options=options, service=service)
            try:
                browser.get(f"{url}/")
                wait = WebDriverWait(browser, 30)
                wait.until(lambda b: b.find_element(By.ID, "status").text == "Ready.")
                browser.find_element(By.ID, "file").send_keys(str(Path(args.image).resolve()))
                wait.until(lambda b: b.execute_script("return document.getElementById('overlay').naturalWidth") > 0)
                time.sleep(0.3)  # let the layout settle
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                png = browser.get_screenshot_as_png()
                tmp = Path(args.out).with_suffix(".tmp.png")
                tmp.write_bytes(png)
                os.replace(tmp, args.out)
                print(f"wrote {args.out}: top class {browser.find_element(By.ID, 'top-class').text!r}")
            finally:
                browser.quit()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
