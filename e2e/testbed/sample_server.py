"""A tiny HTTP server for test pods run by the process kubelet.

`python3 -c SAMPLE_SERVER HOST PORT` serves `/health` (for a readiness probe) and `/metrics` with
a counter of the requests it answered, so a test sees the probe and a Prometheus scrape work.
In a pod spec its arguments are `$(SPECDEPLOY_HOST) $(SPECDEPLOY_PORT)`.
"""

import textwrap

SAMPLE_SERVER = textwrap.dedent(
    """
    import http.server, sys
    hits = 0
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            global hits
            hits += 1
            pages = {"/health": b"ok\\n", "/metrics": b"demo_requests_total %d\\n" % hits}
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")
        def log_message(self, *args):
            pass
    http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
    """
)
