"""``llmitm_listenfile``: write where the proxy listens, once it does, for the processes that
start it (``llmitm run -- COMMAND``, tests) — with ``-q`` the log line is gone."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from mitmproxy import ctx
from mitmproxy.addonmanager import Loader


class ListenFile:
    name = "llmitm_listenfile"

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_listenfile",
            str,
            "",
            "Write the proxy's listen addresses, modes and CA file as JSON to this path.",
        )

    def running(self) -> None:
        path = ctx.options.llmitm_listenfile
        if not path:
            return
        proxyserver = ctx.master.addons.get("proxyserver")
        servers = [
            {
                "mode": server.mode.full_spec,
                "type": server.mode.type_name,
                "addresses": [[host, port] for host, port, *_ in server.listen_addrs],
            }
            for server in proxyserver.servers
        ]
        confdir = Path(os.path.expanduser(ctx.options.confdir))
        document = {
            "servers": servers,
            "ca_file": str(confdir / "mitmproxy-ca-cert.pem"),
            "pid": os.getpid(),
        }
        target = Path(path)
        partial = target.with_suffix(target.suffix + ".partial")
        partial.write_bytes(orjson.dumps(document))
        partial.replace(target)  # readers never see half a file
