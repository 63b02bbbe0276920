"""The web chat page at / in a real headless browser (Debian's chromium + chromium-driver, driven by selenium):
it loads without console errors, shows the model from /props, streams an answer, and stops one mid-stream."""

from __future__ import annotations

import pathlib
import shutil

import pytest
from conftest import ROOT, require_modules, skip_or_fail
from serverutil import RunningServer


@pytest.fixture(scope="module")
def browser(server_deps):
    require_modules("browser", "selenium")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chrome or not driver_bin:
        skip_or_fail("browser", "chromium / chromedriver not found; apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,800"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver_bin), options=opts)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def page_server(stories, server_deps):
    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), alias="stories-demo", llama_kwargs=dict(n_ctx=2048, device="cpu")))
    yield s
    s.stop()


def test_chat_page_streams_and_stops(browser, page_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    d = browser
    d.get(page_server.base + "/")
    wait = WebDriverWait(d, 60)
    wait.until(lambda d: "stories-demo" in d.find_element(By.ID, "model-info").text)
    assert "n_ctx 2048" in d.find_element(By.ID, "model-info").text
    d.find_element(By.ID, "max_tokens").clear()
    d.find_element(By.ID, "max_tokens").send_keys("40")
    d.find_element(By.ID, "temperature").clear()
    d.find_element(By.ID, "temperature").send_keys("0")
    d.find_element(By.ID, "system").send_keys("You tell stories.")
    d.find_element(By.ID, "input").send_keys("Tell me a story.")
    d.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_element(By.ID, "status").text.endswith(" s"))
    answers = d.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")
    assert len(answers) == 1 and len(answers[0].text) > 20
    # the same request through the API gives the same text: the page showed the streamed answer
    import httpx
    api = httpx.post(page_server.base + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "system", "content": "You tell stories."},
                     {"role": "user", "content": "Tell me a story."}],
        "max_tokens": 40, "temperature": 0, "top_k": 40, "top_p": 0.95, "min_p": 0.05}).json()
    assert answers[0].text.strip() == api["choices"][0]["message"]["content"].strip()
    # a long answer, stopped mid-stream
    d.find_element(By.ID, "max_tokens").clear()
    d.find_element(By.ID, "max_tokens").send_keys("1500")
    d.find_element(By.ID, "input").send_keys("Another one.")
    d.find_element(By.ID, "send").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")) == 2 and len(
        d.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")[1].text) > 10)
    d.find_element(By.ID, "stop").click()
    wait.until(lambda d: d.find_element(By.ID, "status").text == "stopped")
    second = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1]
    assert "(stopped)" in second.text and not d.find_element(By.ID, "send").get_attribute("disabled")
    # the server cancelled the generation (its slot is free long before 1500 tokens)
    import time
    deadline = time.monotonic() + 10
    while page_server.state.scheduler.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert page_server.state.scheduler.busy == 0
    assert [m["id"] for m in httpx.get(page_server.base + "/v1/models").json()["data"]] == ["stories-demo"]
    shot = ROOT / "tests" / "artifacts" / "webui.png"
    shot.parent.mkdir(exist_ok=True)
    assert d.save_screenshot(str(shot)) and pathlib.Path(shot).stat().st_size > 1000
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def test_no_webui_flag(stories, server_deps):
    import httpx

    from cooktop.server.app import ServerConfig
    s = RunningServer(ServerConfig(str(stories), llama_kwargs=dict(n_ctx=256, device="cpu"), webui=False))
    try:
        assert httpx.get(s.base + "/").status_code == 404
    finally:
        s.stop()
