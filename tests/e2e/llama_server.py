"""Run llama.cpp's server (the ``xllamacpp`` wheel) on a GGUF until SIGTERM or SIGINT.

The ``llama_server`` fixture in ``conftest.py`` starts this in a subprocess: a crash in the
C++ server then cannot take the pytest process with it, the server's log goes to its own
file instead of into pytest's captured output, and stopping it is a plain signal. It prints
one JSON line ``{"base_url": "http://127.0.0.1:PORT"}`` on stdout once the server listens
(``--port 0``, the default, lets the server pick a free port, so there is no race).

    python tests/e2e/llama_server.py --model .e2e/models/gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="path of the GGUF file")
    parser.add_argument("--alias", default="gemma-3-270m", help="model name the server reports")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    # Codex's first request is ~40 KB (about 4,500 tokens): 16k leaves room for a tool loop.
    parser.add_argument("--n-ctx", type=int, default=16384)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    # Block the stop signals before the server starts its threads, so they all inherit the
    # mask and the signal is left for sigwait below.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)

    # Generation is the one CPU-bound wait of the suite, and the SDK's and Codex's timeouts
    # bound it; under pytest-xdist other workers' processes share the two cores. A higher
    # priority (root may raise it, as CI runs) keeps the server's pace near an idle
    # machine's. Set before the server starts its threads: they inherit it.
    with contextlib.suppress(PermissionError):  # not root: the default priority, as before
        os.setpriority(os.PRIO_PROCESS, 0, -10)

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}  # else responses name the model by its absolute path
    params.n_ctx = args.n_ctx
    params.n_predict = args.n_predict
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.sampling.seed = args.seed
    params.hostnames = [args.host]
    params.port = args.port
    params.use_jinja = True  # needed for requests that carry tools (Codex always does)
    server = xllamacpp.Server(params)  # serves on its own threads
    print(json.dumps({"base_url": server.listening_address}), flush=True)

    # Wait for a stop signal; also stop when the parent (pytest) is gone, so a killed test
    # run leaves no server behind.
    parent = os.getppid()
    while signal.sigtimedwait(stop, 1.0) is None:
        if os.getppid() != parent:
            os._exit(1)  # orphaned: no one waits for a graceful stop of a busy server
    del server  # stops the server's loop (after the request in progress) and frees the model
    return 0


if __name__ == "__main__":
    sys.exit(main())
