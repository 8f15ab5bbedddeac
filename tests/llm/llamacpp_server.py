"""Run llama.cpp's HTTP server (the ``xllamacpp`` wheel) on loopback until killed or stdin closes.

Started by ``llamacpp.LlamaServer`` in a process of its own, so that a test
can kill it mid-stream. Prints ``listening <url>`` once the model is loaded.

Usage: ``python llamacpp_server.py MODEL --ctx-size N --n-predict N --port P [--template FILE]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--ctx-size", type=int, default=2048)
    parser.add_argument("--n-predict", type=int, default=32)
    parser.add_argument("--port", type=int, default=0)
    # One thread: llama.cpp's threads spin at their barriers, and on a busy 2-core
    # machine two of them took a turn 38 s against 2.8 s for one.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--template", help="a jinja chat template file (the model's own has no tools)")
    args = parser.parse_args()

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_ctx = args.ctx_size
    params.n_predict = args.n_predict
    params.n_parallel = 1
    params.port = args.port
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.warmup = False
    params.endpoint_slots = True
    # Greedy sampling: the same request gets the same answer.
    params.sampling.temp = 0.0
    params.sampling.top_k = 1
    if args.template:
        params.chat_template = Path(args.template).read_text()
    server = xllamacpp.Server(params)
    print(f"listening {server.listening_address}", flush=True)
    # Until the test closes our stdin (or kills us): a test that dies leaves no server behind.
    sys.stdin.read()


if __name__ == "__main__":
    main()
