"""The metrics sampler's cost to a training step: step time with and without it, side by side.

A CPU training loop (a small MLP, forward/backward/AdamW; ~50-100 ms a step here) runs in
rounds of N steps, alternately without and with a MetricsRecorder sampling every
`--interval` seconds (CPU, memory, NVML when there is a GPU, the training/checkpoint/job
series, JSON lines written and fsync-free), fed by `note_step`/`note_log` each step as the
Trainer callback feeds it. A third arm runs the way SAT launches an attempt (ADR 0017): the
node's sidecar process (`python -m ckpt_engine.metrics`, system and job series, watching
progress.json) beside a training-process recorder that writes training and checkpoint only.
Prints the median step time of each and `overhead_ratio` = with / without - 1 per arm
(target < 0.01 at a 1 s interval). Arms rotate order each round.

    PYTHONPATH=. .venv/bin/python tests/benchmarks/bench_metrics_sampler.py --rounds 6 --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ckpt_engine.metrics import MetricsRecorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6, help="pairs of rounds (ABBA order)")
    parser.add_argument("--steps", type=int, default=60, help="steps per round")
    parser.add_argument("--interval", type=float, default=1.0, help="sampler interval, seconds")
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(256, args.width)
    step = 0

    def one_round(recorder: MetricsRecorder | None) -> list[float]:
        nonlocal step
        times = []
        for _ in range(args.steps):
            started = time.perf_counter()
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if recorder is not None:
                recorder.note_log({"loss": float(loss), "learning_rate": 1e-4, "epoch": step / 1000}, step, 256)
            times.append(time.perf_counter() - started)
        return times

    one_round(None)  # warm-up
    times: dict[str, list[float]] = {"without": [], "in-process sampler": [], "sidecar": []}
    samples = {name: 0 for name in times}
    arms = list(times)
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.json"
        for pair in range(args.rounds):
            for name in arms[pair % 3:] + arms[:pair % 3]:
                attempt = pair * 3 + arms.index(name) + 1
                if name == "without":
                    times[name] += one_round(None)
                    continue
                sidecar = None
                if name == "sidecar":
                    progress.write_text(json.dumps({"step": step, "attempt": attempt}))
                    env = {**os.environ, "SAT_METRICS_DIR": tmp, "SAT_METRICS_INTERVAL_SECONDS": str(args.interval),
                           "SAT_ATTEMPT": str(attempt), "SAT_NODE": "n0", "SAT_JOB_NAME": "bench",
                           "SAT_PROGRESS_FILE": str(progress)}
                    sidecar = subprocess.Popen([sys.executable, "-m", "ckpt_engine.metrics"], env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    system = Path(f"{tmp}/attempt-{attempt}/n0/system.jsonl")
                    while not system.exists():  # the sidecar's first sample: it is up
                        time.sleep(0.05)
                series = ("training", "checkpoint") if sidecar else None
                recorder = MetricsRecorder(tmp, interval_s=args.interval, job="bench", run="r", attempt=attempt,
                                           node="n0", say=lambda message: None, series=series).start()
                times[name] += one_round(recorder)
                recorder.close()
                if sidecar is not None:
                    sidecar.send_signal(signal.SIGTERM)
                    sidecar.wait(timeout=30)
                samples[name] += Path(f"{tmp}/attempt-{attempt}/n0/system.jsonl").read_text().count("\n")
    base = statistics.median(times["without"])
    mean_base = statistics.fmean(times["without"])
    print(f"steps per arm: {len(times['without'])}; interval {args.interval:g} s")
    for name in arms:
        median, mean = statistics.median(times[name]), statistics.fmean(times[name])
        line = f"{name:20s} median step {median * 1000:7.2f} ms, mean {mean * 1000:7.2f} ms"
        if name != "without":
            line += (f", {samples[name]} system samples, overhead_ratio={median / base - 1:+.4f} (median) "
                     f"mean_overhead_ratio={mean / mean_base - 1:+.4f}  target < 0.01")
        print(line)


if __name__ == "__main__":
    main()
