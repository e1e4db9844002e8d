"""The metrics sampler's cost to a training step: step time with and without it, side by side.

A CPU training loop (a small MLP, forward/backward/AdamW; ~50-100 ms a step here) runs in
rounds of N steps, alternately without and with a MetricsRecorder sampling every
`--interval` seconds (CPU, memory, NVML when there is a GPU, the training/checkpoint/job
series, JSON lines written and fsync-free), fed by `note_step`/`note_log` each step as the
Trainer callback feeds it. Prints the median step time of each and
`overhead_ratio` = with / without - 1 (target < 0.01 at a 1 s interval).

    PYTHONPATH=. .venv/bin/python tests/benchmarks/bench_metrics_sampler.py --rounds 6 --steps 60
"""

from __future__ import annotations

import argparse
import statistics
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
    without: list[float] = []
    with_sampler: list[float] = []
    samples = 0
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.rounds):
            for sampled in ((False, True) if pair % 2 == 0 else (True, False)):
                if sampled:
                    recorder = MetricsRecorder(tmp, interval_s=args.interval, job="bench", run="r", attempt=pair + 1,
                                               node="n0", say=lambda message: None).start()
                    with_sampler += one_round(recorder)
                    recorder.close()
                    samples += Path(f"{tmp}/attempt-{pair + 1}/n0/system.jsonl").read_text().count("\n")
                else:
                    without += one_round(None)
    base, sampled = statistics.median(without), statistics.median(with_sampler)
    mean_base, mean_sampled = statistics.fmean(without), statistics.fmean(with_sampler)
    print(f"steps: {len(without)} without, {len(with_sampler)} with the sampler ({samples} system samples, "
          f"interval {args.interval:g} s)")
    print(f"median step: {base * 1000:.2f} ms without, {sampled * 1000:.2f} ms with")
    print(f"mean step:   {mean_base * 1000:.2f} ms without, {mean_sampled * 1000:.2f} ms with")
    print(f"overhead_ratio={sampled / base - 1:+.4f} (median)  mean_overhead_ratio={mean_sampled / mean_base - 1:+.4f}"
          "  target < 0.01")


if __name__ == "__main__":
    main()
