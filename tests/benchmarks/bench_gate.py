"""Benchmark: what the embedded store's signature check (ADR 0037) costs per request.

Run: PYTHONPATH=. .venv/bin/python tests/benchmarks/bench_gate.py [--requests 200] [--rounds 6]

Two gated moto servers, each in its own process as `make up` runs it: one as shipped (every
request's SigV4 signature verified, bodies hashed), one with `sigv4.verify` replaced by a no-op
(the gate as it was before: key id, token and policy only). One boto3 client per server, signed
with the same kind of key, makes the same requests in rounds of alternating order (ABBA);
the figure is the median over rounds of the per-round ratio verified/unverified, per
operation: HEAD, GET and PUT of 4 KiB, PUT of 1 MiB (its body hashed by the gate), a listing.

Then the check alone, in this process: `PolicyGate.refusal` on a prepared WSGI environ of a
botocore-signed GET, microseconds per call, verify on and off.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def serve(port: int, verify: bool) -> None:
    """The gated server (this process): `--serve PORT [--no-verify]`; the keys come on stdin as make up gives them."""
    sys.path.insert(0, str(ROOT))
    from sat_tasks.io import s3_gate, sigv4

    if not verify:
        sigv4.verify = lambda *_args, **_kwargs: None
    sys.argv = ["s3_gate", "--port", str(port)]
    s3_gate.main()


def start(verify: bool, keys: dict[str, str]):
    from sat_tasks.io.local_s3 import free_port

    port = free_port()
    args = [sys.executable, __file__, "--serve", str(port)] + ([] if verify else ["--no-verify"])
    process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with process.stdin as pipe:
        pipe.write((json.dumps(keys) + "\n").encode())
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.1)
    return process, f"http://127.0.0.1:{port}"


def operations(client, small: bytes, large: bytes):
    return {
        "head 4KiB": lambda i: client.head_object(Bucket="bench", Key=f"small/{i % 50}"),
        "get 4KiB": lambda i: client.get_object(Bucket="bench", Key=f"small/{i % 50}")["Body"].read(),
        "put 4KiB": lambda i: client.put_object(Bucket="bench", Key=f"small/{i % 50}", Body=small),
        "put 1MiB": lambda i: client.put_object(Bucket="bench", Key=f"large/{i % 5}", Body=large),
        "list": lambda i: client.list_objects_v2(Bucket="bench", Prefix="small/"),
    }


def in_process(keys: dict[str, str], calls: int) -> dict[str, float]:
    """Microseconds per `PolicyGate.refusal` of one botocore-signed GET, with and without the check."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from sat_tasks.io import sigv4
    from sat_tasks.io.s3_gate import PolicyGate

    (key_id, secret), = keys.items()
    request = AWSRequest(method="GET", url="http://127.0.0.1:9/bench/small/1?versionId=x")
    S3SigV4Auth(Credentials(key_id, secret), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/bench/small/1", "QUERY_STRING": "versionId=x",
               "RAW_URI": "/bench/small/1?versionId=x", "HTTP_HOST": "127.0.0.1:9", "wsgi.input": io.BytesIO()}
    for name, value in prepared.headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    gate = PolicyGate(lambda *_: [], keys)
    refused = gate.refusal(dict(environ))
    assert refused is None, refused
    real = sigv4.verify
    result = {}
    for label, verify in (("verified", real), ("unverified", lambda *_a, **_k: None)):
        sigv4.verify = verify
        started = time.perf_counter()
        for _ in range(calls):
            gate.refusal(dict(environ))
        result[label] = (time.perf_counter() - started) / calls * 1e6
    sigv4.verify = real
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200, help="requests per operation, per side, per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--serve", type=int)
    parser.add_argument("--no-verify", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, verify=not args.no_verify)
        return
    sys.path.insert(0, str(ROOT))
    import boto3
    from botocore.config import Config

    from sat_tasks.io.local_s3 import LOCAL_ACCESS_KEY, generate_secret

    keys = {LOCAL_ACCESS_KEY: generate_secret()}
    servers = {"verified": start(True, keys), "unverified": start(False, keys)}
    try:
        small, large = os.urandom(4096), os.urandom(1 << 20)
        ops = {}
        for side, (_, url) in servers.items():
            client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                                  aws_access_key_id=LOCAL_ACCESS_KEY, aws_secret_access_key=keys[LOCAL_ACCESS_KEY],
                                  config=Config(retries={"max_attempts": 1}))
            client.create_bucket(Bucket="bench")
            ops[side] = operations(client, small, large)
            for i in range(50):
                ops[side]["put 4KiB"](i)
            for i in range(5):
                ops[side]["put 1MiB"](i)
        names = list(ops["verified"])
        per_request: dict[str, dict[str, list[float]]] = {n: {"verified": [], "unverified": []} for n in names}
        for round_index in range(args.rounds):
            order = ["verified", "unverified"] if round_index % 2 == 0 else ["unverified", "verified"]
            for name in names:
                count = args.requests if name != "put 1MiB" else max(10, args.requests // 10)
                for side in order:
                    started = time.perf_counter()
                    for i in range(count):
                        ops[side][name](i)
                    per_request[name][side].append((time.perf_counter() - started) / count * 1000)
        print(f"bench_gate: {args.rounds} rounds, ABBA; ms per request (median), ratio = median of per-round "
              "verified/unverified")
        summary = {}
        for name in names:
            verified, unverified = per_request[name]["verified"], per_request[name]["unverified"]
            ratios = [v / u for v, u in zip(verified, unverified, strict=True)]
            summary[name] = statistics.median(ratios)
            print(f"  {name:10s} verified={statistics.median(verified):7.3f} ms  "
                  f"unverified={statistics.median(unverified):7.3f} ms  ratio={summary[name]:.3f}  "
                  f"rounds=[{', '.join(f'{r:.3f}' for r in ratios)}]")
        check = in_process(keys, 5000)
        print(f"  the check alone (PolicyGate.refusal, signed GET, in process): verified={check['verified']:.1f} us  "
              f"unverified={check['unverified']:.1f} us  signature check={check['verified'] - check['unverified']:.1f} us")
        print("ratio=" + json.dumps({k: round(v, 3) for k, v in summary.items()}) + f" at {datetime.datetime.now():%H:%M}")
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=10)


if __name__ == "__main__":
    main()
