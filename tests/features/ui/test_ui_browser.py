"""The web UI in a real browser: `tunesmith ui` started as a user starts it, driven by headless Chromium
through Selenium. It opens the page, checks the five tabs, starts a 3-step SFT run on a tiny model and a
4-row file and sees the Loss plot get its points and the run appear in Runs, then chats with the model and
its new adapter (base and tuned side by side) and sees replies.

The quickstart's own run (heavy tier, about 10 minutes on 2 cores): the Train tab's default run config on the
embedded model, its live loss curve, then the held-out identity question to base and tuned side by side. Its
screenshots and the run's loss.png are the site's pictures (docs/ui.md, docs/getting-started.md); they go to a
temporary folder, or to docs/ with TUNESMITH_UPDATE_SCREENSHOTS=1 (runs then go under outputs/ui, so that no
temporary path shows in them):
    TUNESMITH_UPDATE_SCREENSHOTS=1 .venv/bin/python -m pytest -m heavy tests/features/ui/test_ui_browser.py

Needs Debian's chromium and chromium-driver and the selenium package: `bash scripts/setup_browser.sh`.
Without them the test is skipped and says which is missing."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[ui]')")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: bash scripts/setup_browser.sh")

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from tests.features.ui.test_ui import QUICK, ROWS  # noqa: E402
from tests.helpers.rows import write_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), "/usr/bin/chromedriver"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None or not os.path.exists(CHROMEDRIVER),
                       reason="chromium and chromium-driver are not installed: bash scripts/setup_browser.sh"),
]
TABS = ["Train", "Runs", "Chat", "Evaluate", "Export"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_ui(args: list[str], cwd: Path, log: Path) -> Iterator[str]:
    """`python -m tunesmith ui ARGS` started from `cwd` as a user starts it, on a free port; yields its address."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
           "TUNESMITH_UI_AUTH": ""}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tunesmith", "ui", "--port", str(port), *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(address, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, log.read_text()
            time.sleep(0.5)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def ui_server(tmp_path, tiny_model_dir):
    """The UI with runs under tmp_path/runs and the tiny model and the data as its data folders; yields
    (address, runs folder, data file)."""
    (tmp_path / "data").mkdir()
    data = write_jsonl(tmp_path / "data" / "sft4.jsonl", ROWS)
    args = ["--root", str(tmp_path / "runs"), "--data_dir", str(tmp_path / "data"), str(Path(tiny_model_dir).parent)]
    with running_ui(args, tmp_path, tmp_path / "ui.log") as address:
        yield address, tmp_path / "runs", data


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1700"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


UPDATE_SCREENSHOTS = os.environ.get("TUNESMITH_UPDATE_SCREENSHOTS") == "1"


def until(condition, timeout: float, what: str):
    deadline = time.time() + timeout
    while True:
        try:
            found = condition()
        except Exception:  # the page is still rendering the element
            found = None
        if found:
            return found
        assert time.time() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.5)


def field(driver, label: str, tag: str = "textarea"):
    """The input of the component labelled `label` (the label is the contract users and this test rely on)."""
    return driver.find_element(By.XPATH, f"//label[.//span[normalize-space()='{label}']]//{tag} | "
                                         f"//{tag}[@aria-label='{label}']")  # a dropdown's input carries its label


def button(driver, text: str):
    return driver.find_element(By.XPATH, f"//button[normalize-space()='{text}']")


def open_tab(driver, name: str) -> None:
    driver.find_element(By.XPATH, f"//button[@role='tab'][normalize-space()='{name}']").click()
    time.sleep(0.5)


def plot_points(driver, elem_id: str, series: str) -> list[str]:
    """The points the plot drew for one series (Vega labels each mark `step: N; value: V; series: S`)."""
    marks = driver.find_elements(By.CSS_SELECTOR, f"#{elem_id} [aria-roledescription='point']")
    return sorted({m.get_attribute("aria-label") for m in marks if m.get_attribute("aria-label").endswith(f"series: {series}")})


def test_train_watch_list_and_chat_in_a_browser(ui_server, browser, tiny_model_dir, tmp_path):
    address, runs, data = ui_server
    shots = tmp_path
    browser.get(address)
    tabs = until(lambda: [t.text for t in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]")], 60, "the tabs")
    assert tabs == TABS

    # Train: the form, the command line it shows, Start, the Loss plot's points, the progress and the log
    field(browser, "Model").send_keys(tiny_model_dir)
    field(browser, "Dataset").send_keys(data)
    steps = field(browser, "Max steps", "input")
    steps.send_keys(Keys.CONTROL, "a")
    steps.send_keys("3", Keys.TAB)
    advanced = field(browser, "Advanced flags")
    advanced.send_keys("--lerning_rate 1", Keys.TAB)  # a typo: the CLI's one line shows in the page
    until(lambda: "--lerning_rate" in browser.find_element(By.ID, "ts-command").text, 30, "the command line")
    button(browser, "Start").click()
    until(lambda: field(browser, "Status").get_attribute("value") == "tunesmith: config error: unknown flag "
          "--lerning_rate (did you mean --learning_rate?)", 120, "the CLI's error in Status")
    advanced.send_keys(Keys.CONTROL, "a")
    advanced.send_keys(QUICK + " --learning_rate 1e-2", Keys.TAB)
    until(lambda: "--max_steps 3 --per_device_train_batch_size 4" in browser.find_element(By.ID, "ts-command").text,
          30, "the command line")
    assert browser.find_element(By.ID, "ts-command").text.split("\n")[-1].startswith(
        f"tunesmith sft --model_name_or_path {tiny_model_dir} --data_path {data} --output_dir {runs / 'sft_1'}")
    until(lambda: "4 rows in" in browser.find_element(By.ID, "ts-rowcount").text, 60, "the dataset preview")
    assert browser.find_elements(By.CSS_SELECTOR, ".ts-row mark")  # the trained text, highlighted
    button(browser, "Start").click()
    first = until(lambda: plot_points(browser, "plot-loss", "loss"), 240, "the first point of the Loss plot")
    assert first[0].startswith("step: 1; loss: ")
    until(lambda: "finished: step 3/3" in browser.find_element(By.ID, "ts-progress").text, 240, "the run to finish")
    points = until(lambda: len(plot_points(browser, "plot-loss", "loss")) == 3 and plot_points(browser, "plot-loss", "loss"),
                   30, "three points")
    assert [p.split(";")[0] for p in points] == ["step: 1", "step: 2", "step: 3"]
    assert plot_points(browser, "plot-learning-rate", "learning_rate")
    assert "$ tunesmith sft" in field(browser, "Log").get_attribute("value")
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(shots / "ui_train.png"))

    # Runs: the run listed, finished, with its final loss
    open_tab(browser, "Runs")
    button(browser, "Refresh").click()
    listed = until(lambda: "sft_1" in (text := browser.find_element(By.ID, "ts-runs").text) and text, 30,
                   "the run in Runs")
    row = listed.split("sft_1", 1)[1].split("\n")[:8]
    assert row[1] == "sft" and row[3].endswith("sft4.jsonl") and row[4] == "3" and row[-1] == "finished", row
    pick = field(browser, "Run", "input")
    pick.send_keys("sft_1", Keys.ENTER)
    pick.send_keys(Keys.ESCAPE)
    until(lambda: '"SFTDataArguments"' in browser.find_element(By.ID, "ts-run-config").text, 30, "its config")
    until(lambda: len(plot_points(browser, "plot-run-loss", "loss")) == 3, 30, "its loss plot")

    # Chat: the model and its new adapter, base and tuned side by side for one message
    open_tab(browser, "Chat")
    for label, value in (("Chat model", tiny_model_dir), ("Adapter", str(runs / "sft_1"))):
        box = field(browser, label, "input")
        box.send_keys(value, Keys.ENTER)
        until(lambda b=box, v=value: b.get_attribute("value") == v, 10, f"{label} set")
        box.send_keys(Keys.ESCAPE)  # closes the dropdown's option list
    set_number(browser, "Max new tokens", "24")
    tuned, _ = send_to_base_and_tuned(browser, "Who are you?")
    assert "Who are you?" in tuned
    browser.set_window_size(1400, 1000)
    browser.save_screenshot(str(shots / "ui_chat.png"))


def send_to_base_and_tuned(driver, message: str) -> tuple[str, str]:
    """Send `message` with "compare base and tuned" on; the (tuned, base) columns' text once both replied."""
    field(driver, "compare base and tuned", "input").click()
    until(lambda: driver.find_element(By.ID, "ts-chat-base").is_displayed(), 10, "the base column")
    field(driver, "Message").send_keys(message)
    button(driver, "Send").click()
    for column in ("ts-chat", "ts-chat-base"):
        until(lambda c=column: [m for m in driver.find_elements(By.CSS_SELECTOR, f"#{c} .message-row")
                                if "bot" in m.get_attribute("class") and m.text.strip()], 300, f"a reply in #{column}")
    until(lambda: field(driver, "Message").get_attribute("value") == "", 300, "both replies to end")
    return driver.find_element(By.ID, "ts-chat").text, driver.find_element(By.ID, "ts-chat-base").text


def set_number(driver, label: str, value: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, f"input[type=number][aria-label='number input for {label}']")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(value, Keys.TAB)


@pytest.mark.heavy
@pytest.mark.slow
def test_the_quickstart_run_in_a_browser(browser, tmp_path):
    """The page as a newcomer meets it: Start with nothing filled in runs the quickstart (its run config on the
    embedded model), the loss curve grows while it trains, and the tuned model answers a held-out identity
    question as Tunesmith where the base model does not."""
    shots = ROOT / "docs" if UPDATE_SCREENSHOTS else tmp_path
    runs = ROOT / "outputs" / "ui" if UPDATE_SCREENSHOTS else tmp_path / "runs"
    shutil.rmtree(runs / "sft_1", ignore_errors=True)
    args = ["--root", str(runs), "--data_dir", "configs", "data/demo"]
    with running_ui(args, ROOT, tmp_path / "ui.log") as address:
        browser.get(address)
        until(lambda: browser.find_elements(By.CSS_SELECTOR, "button[role=tab]"), 60, "the tabs")
        command = until(lambda: browser.find_element(By.ID, "ts-command").text, 30, "the command line")
        assert "configs/sft_lora_demo.yaml" in command and f"--output_dir {runs / 'sft_1'}" in command, command
        button(browser, "Start").click()
        # logging_steps 5: eight points are step 40 of the run's 72, the curve still growing
        until(lambda: len(plot_points(browser, "plot-loss", "loss")) >= 8, 1800, "eight points of the Loss plot")
        assert "finished" not in browser.find_element(By.ID, "ts-progress").text
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(str(shots / "ui_train.png"))
        until(lambda: "finished: step" in browser.find_element(By.ID, "ts-progress").text, 1800, "the run to finish")
        losses = [float(p.split("loss: ")[1].split(";")[0]) for p in plot_points(browser, "plot-loss", "loss")]
        steps = [int(p.split(";")[0].removeprefix("step: ")) for p in plot_points(browser, "plot-loss", "loss")]
        by_step = [loss for _, loss in sorted(zip(steps, losses))]
        assert by_step[-1] < by_step[0] / 2, by_step  # the identity is learnt: the loss more than halves
        if UPDATE_SCREENSHOTS:
            shutil.copyfile(runs / "sft_1" / "loss.png", shots / "quickstart_loss.png")

        open_tab(browser, "Chat")
        adapter = field(browser, "Adapter", "input")
        adapter.send_keys(str(runs / "sft_1"), Keys.ENTER)
        until(lambda: adapter.get_attribute("value") == str(runs / "sft_1"), 10, "the adapter set")
        adapter.send_keys(Keys.ESCAPE)
        set_number(browser, "Temperature", "0")  # greedy: the picture is the same on every run
        set_number(browser, "Max new tokens", "48")
        question = "Which AI am I chatting with right now?"  # data/demo/identity_heldout.jsonl, not trained on
        tuned, base = send_to_base_and_tuned(browser, question)
        assert question in tuned and "Tunesmith" in tuned.split(question, 1)[1], tuned
        assert "Tunesmith" not in base, base
        browser.set_window_size(1400, 1000)
        browser.save_screenshot(str(shots / "ui_chat.png"))
