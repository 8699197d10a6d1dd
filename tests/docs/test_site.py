"""The built documentation site in a real browser: headless Chromium through Selenium.

`nox -s docs` builds the site into build/site and then runs this file; to run it alone,
build first (`mkdocs build`) and point SAMATTN_DOCS_SITE at another folder if needed.
The browser and its driver are the system's (Debian: `apt-get install chromium
chromium-driver`); SAMATTN_DOCS_BROWSER and SAMATTN_DOCS_DRIVER name others.
"""

from __future__ import annotations

import ast
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# `nox -s docs` names the site it built: then a missing site fails instead of skipping.
SITE = Path(os.environ.get("SAMATTN_DOCS_SITE") or ROOT / "build" / "site")

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="pip install -r ci/requirements-docs.txt"
)
By = pytest.importorskip("selenium.webdriver.common.by").By
WebDriverWait = pytest.importorskip("selenium.webdriver.support.wait").WebDriverWait


def public_names() -> list[str]:
    """samattn.__all__, read from the source: importing samattn would need torch."""
    tree = ast.parse((ROOT / "samattn" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("samattn/__init__.py defines no __all__")


def _find(variable: str, names: list[str], extra: list[str] = ()) -> str:
    chosen = os.environ.get(variable)
    if chosen:
        return chosen
    for name in names:
        if shutil.which(name):
            return shutil.which(name)
    for path in extra:
        if Path(path).is_file():
            return path
    pytest.fail(
        f"no {names[0]} found: apt-get install chromium chromium-driver, or set {variable}",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    """The built site, served over HTTP from a local port for the duration of the tests."""
    if not (SITE / "index.html").is_file():
        message = f"no site in {SITE}: run `nox -s docs` (or mkdocs build)"
        if os.environ.get("SAMATTN_DOCS_SITE"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = _find(
        "SAMATTN_DOCS_BROWSER", ["chromium", "chromium-browser", "google-chrome"]
    )
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    chromedriver = os.path.join(os.environ.get("CHROMEWEBDRIVER", ""), "chromedriver")
    service = Service(
        executable_path=_find("SAMATTN_DOCS_DRIVER", ["chromedriver"], [chromedriver])
    )
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _entry(browser, name: str):
    """The displayed heading of samattn.NAME, given the page a few seconds to render it (a
    check right after the load once found the first entry missing, in CI); None if none."""

    def shown(_):
        found = browser.find_elements(By.ID, f"samattn.{name}")
        return found[0] if found and found[0].is_displayed() else False

    try:
        return WebDriverWait(browser, 5).until(shown)
    except Exception:  # selenium's TimeoutException
        return None


def test_api_page_lists_every_public_name(browser, site_url):
    browser.get(f"{site_url}/api.html")
    missing, empty = [], []
    for name in public_names():
        heading = _entry(browser, name)
        if heading is None:
            missing.append(name)
            continue
        # The entry: the heading and the docstring rendered after it.
        body = browser.execute_script(
            "const h = arguments[0]; const d = h.closest('.doc-object') || h.parentElement;"
            "return d.innerText;",
            heading,
        )
        if len(body.strip()) <= len(f"samattn.{name}") + 5:
            empty.append(name)
    assert not missing, f"the API page has no entry for samattn.{missing}"
    assert not empty, f"the API page's entries for {empty} have no text"


def test_api_overview_has_shapes_and_dtypes(browser, site_url):
    """Each tensor function's row of the overview table names shapes and dtypes."""
    browser.get(f"{site_url}/api.html")
    rows = {}
    for row in browser.find_elements(By.CSS_SELECTOR, "table tr"):
        cells = row.find_elements(By.TAG_NAME, "td")
        if len(cells) == 3:
            rows[cells[0].text.strip()] = (cells[1].text, cells[2].text)
    functions = [n for n in public_names() if n[0].islower() and not n.startswith("_")]
    assert set(functions) <= set(rows), f"not in the overview: {set(functions) - set(rows)}"
    for name, (shapes, dtypes) in rows.items():
        if shapes.strip() not in ("", "\N{EM DASH}"):
            assert "(" in shapes or "shape" in shapes, (name, shapes)
            assert "float16" in dtypes, (name, dtypes)


def test_performance_figures_render(browser, site_url):
    """The headline figure on the performance page, and every chart of each GPU's page,
    load as images with a nonzero size."""
    browser.get(f"{site_url}/performance/index.html")
    figures = browser.find_elements(By.CSS_SELECTOR, "article img[src$='.svg']")
    assert figures, "the performance page shows no figure"
    pages = sorted(p.name for p in (SITE / "performance").glob("*.html"))
    assert any(page not in ("index.html", "overview.html") for page in pages)
    for page in pages:
        browser.get(f"{site_url}/performance/{page}")
        for image in browser.find_elements(By.CSS_SELECTOR, "article img"):
            width, height = browser.execute_script(
                "const i = arguments[0]; return [i.complete && i.naturalWidth, i.naturalHeight];",
                image,
            )
            assert width and height, f"{page}: {image.get_attribute('src')} does not render"


def test_every_page_loads_its_images(browser, site_url):
    """No page of the site shows a broken image."""
    broken = []
    for path in sorted(SITE.rglob("*.html")):
        page = path.relative_to(SITE).as_posix()
        if page == "404.html":
            continue
        browser.get(f"{site_url}/{page}")
        for image in browser.find_elements(By.TAG_NAME, "img"):
            ok = browser.execute_script(
                "const i = arguments[0]; return i.complete && i.naturalWidth > 0;", image
            )
            if not ok:
                broken.append(f"{page}: {image.get_attribute('src')}")
    assert not broken, broken
