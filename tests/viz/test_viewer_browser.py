"""``loongsage view`` in a real headless browser (Debian's chromium through chromium-driver and
Selenium) over a real tiny run: the page lists every saved trajectory, filters them by data
source, reward, length and group as the files say, and a click shows one trajectory whose token
count, trained (loss-masked) count, per-token logprobs and advantages, ground truth, group (the
saved samples of its prompt with their rewards and advantages) and segment tree match the run's
files, in a detail pane that stays in view when the page scrolls. A
screenshot of that view is saved (``LOONGSAGE_VIEWER_SCREENSHOT`` names where); docs/viewer.png
was taken the same way from a run with a longer warm start, whose model already calls the tool)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# --disable-dev-shm-usage: a container's /dev/shm may be small or filled by earlier tests (Ray's
# object store, torch's shared-memory tensors); a renderer that cannot map it hangs the page load.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1500,1100"]


@pytest.fixture(scope="module")
def viewer(tiny_run):
    from loongsage.viz.server import start_viewer

    server = start_viewer(tiny_run)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("chromium / chromium-driver are not installed (.ci/run installs them with apt-get)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # get() returns at DOMContentLoaded; the test waits for what it reads (rows, the curves image)
    # itself, each with its own deadline, so one slow resource is a named failure, not a client timeout
    options.page_load_strategy = "eager"
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    yield driver
    driver.quit()


def saved_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((run_dir / "samples").glob("step_*.jsonl"))
            for line in p.read_text().splitlines()]


def wait_until(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"the page did not get there in {timeout:.0f} s: {what}")


def rows_shown(driver) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#samples tr.sample-row")


def test_page_lists_filters_and_shows_a_trajectory_as_the_files_say(tiny_run, viewer, browser, tmp_path):
    from selenium.webdriver.common.by import By

    saved = saved_rows(tiny_run)
    browser.get(viewer)
    wait_until(lambda: len(rows_shown(browser)) == len(saved), f"{len(saved)} sample rows listed")
    assert browser.find_element(By.ID, "run-path").text == str(tiny_run.resolve())
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#curves .panel polyline"), "the curves drawn",
               timeout=120)

    # filters: length >= the median response length, then a reward ceiling below every reward
    lengths = sorted(len(r["response_ids"]) for r in saved)
    floor = lengths[len(lengths) // 2]
    browser.find_element(By.ID, "min-length").send_keys(str(floor))
    browser.find_element(By.ID, "apply").click()
    wanted = sum(len(r["response_ids"]) >= floor for r in saved)
    wait_until(lambda: len(rows_shown(browser)) == wanted, f"{wanted} rows at length >= {floor}")
    browser.find_element(By.ID, "min-length").clear()
    browser.find_element(By.ID, "max-reward").send_keys(str(min(r["reward"] for r in saved) - 1))
    browser.find_element(By.ID, "apply").click()
    wait_until(lambda: browser.find_element(By.ID, "sample-count").text == "0 trajectories",
               "no rows under the reward ceiling")
    browser.find_element(By.ID, "max-reward").clear()
    source = saved[0]["source"]
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "filter-source")).select_by_value(source)
    Select(browser.find_element(By.ID, "filter-step")).select_by_value("1")
    browser.find_element(By.ID, "apply").click()
    step1 = [r for r in saved if r["step"] == 1 and r["source"] == source]
    wait_until(lambda: len(rows_shown(browser)) == len(step1) and
               all(row.get_attribute("data-step") == "1" for row in rows_shown(browser)),
               f"the {len(step1)} step-1 rows of {source}")

    # click through to the longest trajectory of step 1
    index = max(range(len(step1)), key=lambda i: len(step1[i]["response_ids"]))
    sample = step1[index]
    browser.find_element(By.CSS_SELECTOR, f'#samples tr.sample-row[data-index="{index}"]').click()
    wait_until(lambda: browser.find_element(By.ID, "token-count").text == str(len(sample["response_ids"])),
               "the clicked trajectory's token count")
    assert browser.find_element(By.ID, "masked-count").text == str(sum(sample["loss_mask"]))
    tokens = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")
    assert len(tokens) == len(sample["response_ids"])
    assert len(browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.m1")) == sum(sample["loss_mask"])
    first_trained = sample["loss_mask"].index(1)
    title = tokens[first_trained].get_attribute("title")
    assert f"id {sample['response_ids'][first_trained]}" in title
    assert f"train logprob {sample['train_logprobs'][first_trained]:.4f}" in title
    assert f"rollout logprob {sample['rollout_logprobs'][first_trained]:.4f}" in title
    assert f"weight version {sample['weight_versions'][first_trained]}" in title
    segments = browser.find_elements(By.CSS_SELECTOR, "#segments li.segment")
    assert segments and segments[0].text.startswith("#0 root")
    assert "← this sample" in browser.find_element(By.CSS_SELECTOR, "#segments li.current").text
    assert browser.find_elements(By.CSS_SELECTOR, "#messages .msg.user")
    reward = json.loads(browser.find_element(By.ID, "reward").text)
    assert reward["reward"] == sample["reward"] and reward["trajectory_reward"]["reward"] == sample["reward"]

    # reward debugging: ground truth, advantage (per sample and per token), the sample's group
    assert json.loads(browser.find_element(By.ID, "ground-truth").text) == sample["ground_truth"]
    trained_advantages = [a for a, m in zip(sample["advantages"], sample["loss_mask"]) if m]
    advantage = sum(trained_advantages) / len(trained_advantages)
    assert browser.find_element(By.ID, "detail-advantage").text == f"{advantage:.3f}"
    assert f"advantage {sample['advantages'][first_trained]:.4f}" in title
    group = [(i, r) for i, r in enumerate(r for r in saved if r["step"] == 1)
             if r["group_id"] == sample["group_id"] and r["source"] == sample["source"]]
    group_rows = browser.find_elements(By.CSS_SELECTOR, "#group tr")
    assert [row.find_elements(By.TAG_NAME, "td")[1].text for row in group_rows] == \
        [f"{r['reward']:.2f}" for _, r in group]
    assert len(group) >= 2 and all(r["ground_truth"] == sample["ground_truth"] for _, r in group)

    # the detail pane stays in view when the list scrolls (a short window makes the page scroll)
    browser.set_window_size(1500, 500)
    browser.execute_script("window.scrollTo(0, 200);")  # (at the very bottom the page's end pushes it up)
    scrolled, top = browser.execute_script(
        "return [window.scrollY, document.getElementById('detail').getBoundingClientRect().top];")
    assert scrolled == 200 and 0 <= top <= 20, (scrolled, top)  # not scrolled away: it was at about 50
    browser.set_window_size(1500, 1100)
    browser.execute_script("window.scrollTo(0, 0);")

    # filter by group: only that prompt's samples of step 1
    browser.find_element(By.ID, "filter-group").send_keys(str(sample["group_id"]))
    browser.find_element(By.ID, "apply").click()
    wait_until(lambda: len(rows_shown(browser)) == len(group), f"the {len(group)} rows of group {sample['group_id']}")
    browser.find_element(By.ID, "filter-group").clear()
    browser.find_element(By.ID, "apply").click()
    wait_until(lambda: len(rows_shown(browser)) == len(step1), "the step-1 rows again")

    Select(browser.find_element(By.ID, "colour-by")).select_by_value("version")
    shot = Path(os.environ.get("LOONGSAGE_VIEWER_SCREENSHOT") or tmp_path / "viewer.png")
    assert browser.save_screenshot(str(shot))
    from PIL import Image

    with Image.open(shot) as image:
        assert image.format == "PNG" and image.size[0] >= 1000


def compare_run(folder: Path, steps: int) -> Path:
    """A second run directory with only ``metrics.jsonl`` (all the curves read): a reward that
    rises by 0.05 a step, over more steps than the tiny run."""
    folder.mkdir(parents=True)
    rows = [{"step": s, "rollout/reward_mean": 0.05 * s, "timing/step": 1.0 + s % 3} for s in range(steps)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_curves_overlay_runs_show_values_on_hover_and_zoom_to_a_dragged_range(tiny_run, browser, tmp_path):
    """The interactive chart: one line per run with every logged point, the hovered step's values
    as metrics.jsonl has them, a drag narrows every panel to the dragged steps and a double-click
    restores them all."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from loongsage.viz.server import start_viewer

    other = compare_run(tmp_path / "other", steps=20)
    server = start_viewer(tiny_run, compare=[other])
    try:
        browser.get(server.url)
        reward = "#curves .panel[data-metric='rollout/reward_mean']"
        wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, f"{reward} polyline")) == 2,
                   "two reward lines", timeout=120)
        tiny_rewards = [r["rollout/reward_mean"] for r in json_rows(tiny_run / "metrics.jsonl")
                        if "rollout/reward_mean" in r]
        points = {line.get_attribute("data-run"): int(line.get_attribute("data-points"))
                  for line in browser.find_elements(By.CSS_SELECTOR, f"{reward} polyline")}
        assert points == {tiny_run.name: len(tiny_rewards), "other": 20}
        key = browser.find_element(By.ID, "run-key").text
        assert tiny_run.name in key and "other" in key

        svg = browser.find_element(By.CSS_SELECTOR, f"{reward} svg")
        width = svg.size["width"]
        plot_left, plot_width = width * 48 / 460, width * (460 - 48 - 8) / 460  # the panel's padding, in pixels
        at_step = lambda step, x1=19: plot_left + step / x1 * plot_width - width / 2  # offset from the centre
        ActionChains(browser).move_to_element_with_offset(svg, at_step(1), 0).perform()
        tip = browser.find_element(By.ID, "curve-tip")
        wait_until(lambda: tip.get_attribute("data-step") == "1", "the tip at step 1")
        assert f"{tiny_run.name}: {float(f'{tiny_rewards[1]:.4g}'):g}" in tip.text
        assert "other: 0.05" in tip.text

        ActionChains(browser).move_to_element_with_offset(svg, at_step(5), 0).click_and_hold() \
            .move_to_element_with_offset(svg, at_step(12), 0).release().perform()
        span = lambda: tuple(browser.find_element(By.CSS_SELECTOR, reward).get_attribute(a) for a in ("data-x0", "data-x1"))
        wait_until(lambda: span() == ("5", "12"), "the reward panel zoomed to steps 5-12")
        assert all(p.get_attribute("data-x0") == "5" for p in browser.find_elements(By.CSS_SELECTOR, "#curves .panel"))
        zoomed = browser.find_element(By.CSS_SELECTOR, f"{reward} polyline[data-run='other']")
        assert zoomed.get_attribute("data-points") == "8"
        ActionChains(browser).double_click(browser.find_element(By.CSS_SELECTOR, f"{reward} svg")).perform()
        wait_until(lambda: browser.find_element(By.CSS_SELECTOR, f"{reward} polyline[data-run='other']")
                   .get_attribute("data-points") == "20", "all 20 steps again")
    finally:
        server.stop()


def json_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_view_command_serves_on_loopback_and_reports_its_address(tiny_run):
    proc = subprocess.Popen([sys.executable, "-m", "loongsage.cli", "view", str(tiny_run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("loongsage view: http://127.0.0.1:"), line
        url = line.split()[2]
        import httpx

        steps = httpx.get(f"{url}/api/steps", timeout=30).json()
        assert [s["step"] for s in steps] == [0, 1]
        assert httpx.get(f"{url}/api/samples/9/0", timeout=30).status_code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
