"""The hub's proxy, from the wheelhouse: the pure-Python configurable-http-proxy (PyPI
`configurable-http-proxy`, Apache-2.0; JupyterHub's own is a Node.js program from npm), plus TLS.

JupyterHub starts its proxy as `COMMAND --ip IP --port PORT --api-ip IP --api-port PORT --error-target URL
--log-level LEVEL [--ssl-key KEY --ssl-cert CERT]` with CONFIGPROXY_AUTH_TOKEN in the environment
(jupyterhub/proxy.py, ConfigurableHTTPProxy.start). The Python package's own command refuses --ssl-*
("not supported yet"): this one serves the same proxy (its PythonProxy: routes, the REST API the hub
drives, websockets, last activity) with tornado, and with the teacher's certificate when the hub has one
(`make room ROOM_ARGS=--https`, docs/WORKSHOP.md). Anything else the hub could ask (unix sockets,
host routing, internal SSL) is refused in one line, never ignored.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys


STREAM_TIMEOUT_S = 12 * 3600
"""A proxied response may stream this long: the hub's spawn progress (an EventSource) streams until the
server is up, JupyterLab's event streams for as long as the page is open."""
_HOP_BY_HOP = {"transfer-encoding", "connection", "keep-alive", "upgrade", "proxy-connection", "te", "trailer"}


def streaming_handler():
    """The package's ProxyHandler, with responses passed on as they arrive instead of read whole first.

    configurable-http-proxy 0.4's handler fetches the whole upstream response, with tornado's default
    20 s request timeout, before writing a byte: the hub's spawn-pending page, which waits on an
    EventSource (/hub/api/users/NAME/server/progress), got a 503 after 20 s and never went on to the
    learner's JupyterLab (seen here with four logins under load). This one writes each chunk as it comes.
    """
    from configurable_http_proxy.handlers import ProxyHandler
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest
    from tornado.httputil import HTTPHeaders

    class StreamingProxyHandler(ProxyHandler):
        async def call_proxy(self, path=None):
            url = await self.get_target_url(path)
            if url is None:
                return
            plain = self._get_proxy_request(url)
            upstream: dict = {"code": None, "headers": HTTPHeaders(), "started": False}

            def on_header(line: str) -> None:
                if line.startswith("HTTP/"):  # a status line (again after a 100 Continue)
                    upstream["code"], upstream["headers"] = int(line.split(" ", 2)[1]), HTTPHeaders()
                elif line.strip():
                    upstream["headers"].parse_line(line)
                elif upstream["code"] != 100 and not upstream["started"]:
                    self.set_status(upstream["code"])
                    for key, value in upstream["headers"].get_all():
                        if key.lower() not in _HOP_BY_HOP:
                            (self.set_header if key.lower() in ("server", "content-type", "date") else self.add_header)(key, value)
                    upstream["started"] = True

            def on_chunk(chunk: bytes) -> None:
                self.write(chunk)
                self.flush()

            request = HTTPRequest(url, method=plain.method, headers=plain.headers, body=plain.body,
                                  follow_redirects=False, allow_nonstandard_methods=True, decompress_response=False,
                                  connect_timeout=20, request_timeout=STREAM_TIMEOUT_S,
                                  header_callback=on_header, streaming_callback=on_chunk)
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
            if not upstream["started"]:
                await self.handle_proxy_error(503, response.error)
                return
            self.finish()

    return StreamingProxyHandler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ip", default="")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-ip", default="127.0.0.1")
    parser.add_argument("--api-port", type=int)
    parser.add_argument("--error-target")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--ssl-key")
    parser.add_argument("--ssl-cert")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"room proxy: {' '.join(unknown)} is not supported here (only the options above); "
              "leave JupyterHub's internal_ssl, unix sockets and subdomains off", file=sys.stderr)
        return 2
    if bool(args.ssl_key) != bool(args.ssl_cert):
        print("room proxy: --ssl-key and --ssl-cert go together (scripts/room_hub.py cert makes both)", file=sys.stderr)
        return 2

    from configurable_http_proxy import log
    from configurable_http_proxy.configproxy import PythonProxy
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop

    log.setLevel(getattr(logging, str(args.log_level).upper(), logging.INFO))
    proxy = PythonProxy({
        "log": log, "auth_token": os.environ.get("CONFIGPROXY_AUTH_TOKEN"), "error_target": args.error_target,
        "default_target": None, "host_routing": None, "custom_headers": {}, "timeout": None,
        "proxy_timeout": None, "x_forward": True, "prepend_path": True, "include_prefix": True, "storage_backend": None,
    })
    from tornado.web import Application

    proxy.proxy_app = Application([(r"/(.*)", streaming_handler(), {"proxy": proxy})])
    context = None
    if args.ssl_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.ssl_cert, args.ssl_key)
    HTTPServer(proxy.proxy_app, ssl_options=context, xheaders=False).listen(args.port, args.ip)
    HTTPServer(proxy.api_app).listen(args.api_port or args.port + 1, args.api_ip)
    log.info(f"room proxy: {'https' if context else 'http'}://{args.ip or '*'}:{args.port}, "
             f"API on {args.api_ip}:{args.api_port or args.port + 1}")
    IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
