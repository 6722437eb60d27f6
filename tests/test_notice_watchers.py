"""Per-node preemption watchers: an actor pinned to a node reads that node's metadata service.

A fake GCP metadata server (``instance/preempted`` flips to TRUE) stands in for the VM's; the
watcher actor on the local node sees the flip and the driver's poll returns that node with a
deadline about 30 s ahead (GCP's notice).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@pytest.mark.ray
def test_notice_watchers_report_their_nodes_notice(ray_session: Any) -> None:
    from orchestrator.elastic.notice_watchers import NoticeWatchers

    state = {"preempted": "FALSE"}

    class Metadata(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            body = state["preempted"].encode()
            self.send_response(200)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    node = ray_session.get_runtime_context().get_node_id()
    watch = NoticeWatchers("gcp", [node], base_url=f"http://127.0.0.1:{server.server_port}", poll_interval_s=0.2)
    try:
        assert watch.poll(timeout_s=30.0) == []
        state["preempted"] = "TRUE"
        seen: list[tuple[str, float]] = []
        for _ in range(100):
            seen = watch.poll(timeout_s=10.0)
            if seen:
                break
            time.sleep(0.2)
        assert [n for n, _ in seen] == [node]
        assert 20.0 < seen[0][1] - time.time() <= 31.0
    finally:
        watch.stop()
        server.shutdown()
