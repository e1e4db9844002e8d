"""Benchmark: stage_data's parallel, verified staging against a single-stream boto3 download.

Run: .venv/bin/python tests/benchmarks/bench_staging.py [--files 400] [--size 16384] [--rtt-ms 20]

On plain loopback with 2 cores, moto's server (one GIL) and the client split the CPU, so
no client can gain more than about 2x there; `--rtt-ms` adds the round trip a real store
has, which is what parallel transfers hide.

Both read the same prefix (the baseline with one get_object per key, no verification) from moto's S3 server on 127.0.0.1 in its own process, in one process,
alternating, into fresh directories; the line to read is `ratio=<single/parallel>`
(target >= 2 on many small files). The parallel path also verifies sizes and MD5s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--size", type=int, default=16 * 1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="simulated network round trip added to every request (0: plain loopback)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    home = Path(tempfile.mkdtemp(prefix="sat-bench-"))
    os.environ.update({"AIRFLOW_HOME": str(home), "AIRFLOW_CONFIG": str(ROOT / "airflow.cfg")})
    from sat_tasks.io.local_s3 import LocalS3Server
    from sat_tasks.io.object_storage import object_storage_hook, split_s3_uri, stage_prefix

    with LocalS3Server(process=True) as server:
        os.environ.update(server.connection_env())
        hook = object_storage_hook()
        hook.create_bucket(bucket_name="bench", region_name="us-east-1")
        client = hook.get_conn()
        if args.rtt_ms:
            # A real object store answers in tens of ms; sleeping before each send models
            # that round trip (it overlaps across threads, as network waits do).
            client.meta.events.register("before-send.s3.*", lambda **_: time.sleep(args.rtt_ms / 1000))
        payload = os.urandom(args.size)
        for i in range(args.files):
            client.put_object(Bucket="bench", Key=f"ds/shard-{i // 50}/f{i:05d}.bin", Body=payload)
        uri = "s3://bench/ds/"

        def single(dest: Path) -> None:
            bucket, prefix = split_s3_uri(uri)
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    target = dest / obj["Key"][len(prefix):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"]
                    target.write_bytes(body.read())

        def parallel(dest: Path) -> None:
            report = stage_prefix(hook, uri, dest, workers=args.workers, log=lambda _: None)
            assert report.transferred == args.files and report.checksum_verified == args.files

        times = {"single": [], "parallel": []}
        for _ in range(args.repeat):
            for name, fn in (("single", single), ("parallel", parallel)):
                dest = home / f"out-{name}"
                shutil.rmtree(dest, ignore_errors=True)
                start = time.perf_counter()
                fn(dest)
                times[name].append(time.perf_counter() - start)
        s, p = statistics.median(times["single"]), statistics.median(times["parallel"])
        mb = args.files * args.size / 1e6
        print(f"{args.files} files x {args.size} B ({mb:.1f} MB), simulated RTT {args.rtt_ms:.0f} ms, "
              f"median of {args.repeat}")
        print(f"single-stream boto3: {s:.2f}s ({mb / s:.1f} MB/s)")
        print(f"stage_prefix ({args.workers} workers, verified): {p:.2f}s ({mb / p:.1f} MB/s)")
        print(f"ratio={s / p:.2f}")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
