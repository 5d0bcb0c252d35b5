"""``capo view``'s local server: the site's files over HTTP on 127.0.0.1 (port 0: a free one), standard
library only (capo_envs.core.http's server: bounded backlog, JSON errors, a thread per request)."""

from __future__ import annotations

from http import HTTPStatus

from capo_envs.core.http import JSONHandler, JSONServer

from .site import Site


class ViewHandler(JSONHandler):
    site: Site  # set on the subclass make_server builds

    def do_GET(self) -> None:
        found = self.site.get(self.route.partition("#")[0])
        if found is None:
            self.send_error(HTTPStatus.NOT_FOUND, f"no such page: {self.route}")
            return
        body, content_type = found
        self._answered = True
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # a live run's data changes between reloads
        self.end_headers()
        self.wfile.write(body)


def make_server(site: Site, host: str = "127.0.0.1", port: int = 0) -> JSONServer:
    """Bound, not serving yet (``serve_forever`` or ``start_in_thread``); ``server.url`` says where."""
    handler = type("SiteHandler", (ViewHandler,), {"site": site})
    return JSONServer(host, port, handler)
