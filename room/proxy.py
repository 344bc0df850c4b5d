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
