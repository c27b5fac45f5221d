"""Serve a frozen model on an OpenAI-compatible /v1/chat/completions, e.g. as a training run's --judge.

    python launch/serve.py --model smollm2-135m-instruct --port 8000
    python launch/train.py --judge http://127.0.0.1:8000/v1 --judge-rubric rubric.md

Decodes greedily (a judge runs at temperature 0), batching the requests that arrive together; the machinery
is nanorllm/rollout/serve.py. Prints one line with its URL once it listens; Ctrl-C or SIGTERM stops it.
"""

import argparse
import signal
import sys
import threading

from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.rollout.serve import FrozenServer
from nanorllm.utils.devices import configure_threads


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, HF model directory or hub id")
    ap.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--max-new-tokens", type=int, default=512, help="longest reply (a request's max_tokens is capped)")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1:
        print(f"error: --max-new-tokens must be >= 1, got {args.max_new_tokens}", file=sys.stderr)
        return 2
    configure_threads(args.device, args.threads, 1)
    policy = HFCausalPolicy.from_name(args.model, device=args.device, dtype=args.dtype, replica=True)
    server = FrozenServer(policy, model_name=args.model, max_new_tokens=args.max_new_tokens, host=args.host,
                          port=args.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"[serve] {args.model} on {server.url}", flush=True)
    stop.wait()
    server.close()
    print(f"[serve] stopped after {server.served} replies", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
