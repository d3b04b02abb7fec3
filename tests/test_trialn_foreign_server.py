"""A worker pointed at a web server that is not asyncsync's (its answer an HTML page)
stops with one ``error:`` line that asks whether the URL is an asyncsync server's; the
page's lines were printed as they came, after the error line."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncsync.engine.channel import RequestRejected
from asyncsync.study.node_commands import join_refused
from tests.test_cli import one_error, run_main

RECIPE = """
[defaults]
workers = 1
[defaults.model]
name = "mlp"
[[runs]]
name = "net"
protocol = "asp"
"""

PAGE = "<!DOCTYPE HTML>\n<html>\n  <body>\n    <p>Error code: 501</p>\n  </body>\n</html>\n"


def test_a_foreign_servers_page_becomes_one_line() -> None:
    refused = join_refused(RequestRejected(501, PAGE + "x" * 1000), "http://h:1", 0)
    text = str(refused)
    assert "\n" not in text and len(text) < 500
    assert text.startswith("the server at http://h:1 refused worker 0's join (501: "
                           "<!DOCTYPE HTML> <html> <body> <p>Error code: 501</p>")
    assert text.endswith("...): is this the URL of an asyncsync server?")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep the web server's access log out of the command's output."""


@pytest.fixture
def web_server() -> Iterator[str]:
    """A standard library web server (it answers POST with 501 and an HTML page)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_worker_pointed_at_a_web_server(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path, web_server: str) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    line = one_error(run_main(capsys, "worker", "--recipe", str(recipe), "--server",
                              web_server, "--rank", "0"))
    assert "(501: " in line and line.endswith("is this the URL of an asyncsync server?")
