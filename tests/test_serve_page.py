"""serve.py's page in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium): a
sentence typed and translated shows the server's translation, its n-best and an attention heat map with a cell per
(target piece, source piece); on a server with --suggestions, the "suggest a better translation" control sends
the edited translation to /suggest and the row lands in the database. Skipped when Chromium is missing, except in CI
(CI=true), where scripts/test.sh installs it."""
import json
import os
import shutil
import sqlite3
import sys
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_serve  # noqa: E402

SENTENCE = "Heute ist der zweite Oktober zweitausendeinundvierzig."
BEAM = 4
#: Chromium's flags: headless, and nothing that reaches beyond 127.0.0.1 or needs a sandbox (tests run as root).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1200,1000")


@pytest.fixture
def browser(tmp_path):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        message = "needs Debian's chromium and chromium-driver: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (scripts/test.sh installs them in CI)")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + ("--user-data-dir=%s" % (tmp_path / "profile"),):
        options.add_argument(flag)
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    yield session
    session.quit()


def test_the_page_shows_the_translation_nbest_and_attention(tiny_model, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    logdir, data_dir = tiny_model
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir, "--beam_size", str(BEAM)]) as server:
        request = urllib.request.Request(server.url + "translate", json.dumps(
            {"q": SENTENCE, "source": "de", "target": "en", "attention": True}).encode(),
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            expected = json.loads(response.read())
        browser.get(server.url)
        WebDriverWait(browser, 60).until(lambda b: "German" in b.find_element(By.ID, "languages").text)
        browser.find_element(By.ID, "source").send_keys(SENTENCE)
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 120).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#maps svg rect.cell"))
        browser.save_screenshot(str(tmp_path / "serve_page.png"))
        assert browser.find_element(By.ID, "translation").text == expected["translatedText"]
        rows = browser.find_elements(By.CSS_SELECTOR, "#nbest tr")
        assert [row.find_elements(By.TAG_NAME, "td")[1].text for row in rows] == [
            entry["text"] for entry in expected["nbest"]]
        (entry,) = expected["attention"]
        cells = browser.find_elements(By.CSS_SELECTOR, "#maps svg rect.cell")
        assert len(cells) == len(entry["source"]) * len(entry["target"])
        assert [label.text for label in browser.find_elements(By.CSS_SELECTOR, "#maps svg .source-label")] == \
            entry["source"]
        assert len({cell.get_attribute("fill") for cell in cells}) > 1  # weights drawn, not a blank grid
    assert os.path.getsize(tmp_path / "serve_page.png") > 0


def test_the_suggestion_control_stores_the_edited_translation(tiny_model, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    logdir, data_dir = tiny_model
    database, key = str(tmp_path / "suggestions.db"), "k3y"
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir, "--suggestions", database,
                             "--api_key", key]) as server:
        browser.get(server.url + "?api_key=" + key)
        WebDriverWait(browser, 60).until(lambda b: "German" in b.find_element(By.ID, "languages").text)
        assert not browser.find_element(By.ID, "suggest-box").is_displayed()  # nothing translated yet
        browser.find_element(By.ID, "source").send_keys(SENTENCE)
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 120).until(lambda b: b.find_element(By.ID, "suggest-box").is_displayed())
        shown = browser.find_element(By.ID, "translation").text
        field = browser.find_element(By.ID, "suggestion")
        assert field.get_attribute("value") == shown  # prefilled with the translation
        field.clear()
        field.send_keys("Today is the second of October, 2041.")
        browser.find_element(By.ID, "suggest").click()
        WebDriverWait(browser, 60).until(lambda b: b.find_element(By.ID, "suggest-status").text)
        assert browser.find_element(By.ID, "suggest-status").text == "Thank you"
    rows = sqlite3.connect(database).execute("SELECT q, s, source, target, translation, model FROM suggestions")
    [(q, s, source, target, translation, model)] = rows.fetchall()
    assert (q, s, source, target, translation) == (SENTENCE, "Today is the second of October, 2041.", "de", "en",
                                                   shown)
    assert model.startswith(logdir + "@")


def test_the_suggestion_control_is_hidden_without_suggestions(tiny_model, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    logdir, data_dir = tiny_model
    with bench_serve.Server(["--logdir", logdir, "--data_dir", data_dir]) as server:
        browser.get(server.url)
        WebDriverWait(browser, 60).until(lambda b: "German" in b.find_element(By.ID, "languages").text)
        browser.find_element(By.ID, "source").send_keys(SENTENCE)
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 120).until(lambda b: b.find_element(By.ID, "translation").text)
        assert not browser.find_element(By.ID, "suggest-box").is_displayed()
