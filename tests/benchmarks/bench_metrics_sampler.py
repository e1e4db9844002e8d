"""The metrics sampler's cost to a training step: step time with and without it, side by side.

A CPU training loop (a small MLP, forward/backward/AdamW; ~50-100 ms a step here) runs in
rounds of N steps, alternately without and with a MetricsRecorder sampling every
`--interval` seconds (CPU, memory, NVML when there is a GPU, the training/checkpoint/job
series, JSON lines written and fsync-free), fed by `note_step`/`note_log` each step as the
Trainer callback feeds it. A third arm runs the way SAT launches an attempt (ADR 0017): the
node's sidecar process (`python -m ckpt_engine.metrics`, system and job series, watching
progress.json) beside a training-process recorder that writes training and checkpoint only.
Prints the median step time of each and `overhead_ratio` = with / without - 1 per arm
(target < 0.01 at a 1 s interval). Arms rotate order each round. Step time on a shared
2-core machine drifts by a few percent between rounds, so it also prints the paired
estimate (each round against the `without` round of the same rotation, median over
rotations, with the spread) and what the noise cannot blur: the CPU the sampler itself
used, from /proc (the sidecar process after its first sample; the sampler thread), per
sample and as a share of the training process's CPU over the same rounds.

    PYTHONPATH=. .venv/bin/python tests/benchmarks/bench_metrics_sampler.py --rounds 6 --steps 60
    PYTHONPATH=. .venv/bin/python tests/benchmarks/bench_metrics_sampler.py --pairs 150 --steps 12
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


def cpu_seconds(stat_path: str) -> float:
    """utime + stime of a process or thread from its /proc stat file."""
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6, help="pairs of rounds (ABBA order)")
    parser.add_argument("--steps", type=int, default=60, help="steps per round")
    parser.add_argument("--interval", type=float, default=1.0, help="sampler interval, seconds")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--pairs", type=int, default=0,
                        help="instead: this many short (without, sidecar) pairs, the sidecar paused between "
                             "its rounds (SIGSTOP/SIGCONT) so that rounds can be ~1 s and drift cancels")
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
    if args.pairs:
        paused_sidecar_pairs(args, one_round)
        return
    times: dict[str, list[float]] = {"without": [], "in-process sampler": [], "sidecar": []}
    samples = {name: 0 for name in times}
    rounds: dict[str, list[float]] = {name: [] for name in times}  # each round's median step
    sampler_cpu = {name: 0.0 for name in times}  # the sampler's own CPU seconds (steady state)
    training_cpu = {name: 0.0 for name in times}  # the training process's CPU seconds in those rounds
    arms = list(times)
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.json"
        for pair in range(args.rounds):
            for name in arms[pair % 3:] + arms[:pair % 3]:
                attempt = pair * 3 + arms.index(name) + 1
                if name == "without":
                    round_times = one_round(None)
                    times[name] += round_times
                    rounds[name].append(statistics.median(round_times))
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
                thread_stat = f"/proc/self/task/{recorder._thread.native_id}/stat"
                sampler_stat = f"/proc/{sidecar.pid}/stat" if sidecar else thread_stat
                before, train_before = cpu_seconds(sampler_stat), cpu_seconds("/proc/self/stat")
                round_times = one_round(recorder)
                sampler_cpu[name] += cpu_seconds(sampler_stat) - before
                training_cpu[name] += cpu_seconds("/proc/self/stat") - train_before
                times[name] += round_times
                rounds[name].append(statistics.median(round_times))
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
            paired = sorted(r / w - 1 for r, w in zip(rounds[name], rounds["without"]))
            line += (f"\n{'':20s} paired per rotation: median {statistics.median(paired):+.4f}, "
                     f"middle half {paired[len(paired) // 4]:+.4f} .. {paired[(3 * len(paired)) // 4]:+.4f}; "
                     f"sampler CPU {sampler_cpu[name] * 1000 / max(samples[name], 1):.1f} ms per sample, "
                     f"{sampler_cpu[name] / training_cpu[name]:.4f} of the training process's CPU")
        print(line)


def paused_sidecar_pairs(args: argparse.Namespace, one_round) -> None:  # type: ignore[no-untyped-def]
    """(without, sidecar) pairs of short rounds, one sidecar process paused (SIGSTOP) outside its rounds.

    A stopped process takes no CPU, so a `without` round is a round without the sidecar; a
    continued one samples on its schedule (one sample per interval of its rounds, as on a
    node). Adjacent ~1 s rounds see the same machine, so the drift between them is small; the
    median of the per-pair ratios over many pairs is the estimate. The training process's own
    recorder (training and checkpoint series, one thread) runs in both arms: its cost is the
    in-process arm's of the default mode.
    """
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.json"
        progress.write_text(json.dumps({"step": 1, "attempt": 1}))
        env = {**os.environ, "SAT_METRICS_DIR": tmp, "SAT_METRICS_INTERVAL_SECONDS": str(args.interval),
               "SAT_ATTEMPT": "1", "SAT_NODE": "n0", "SAT_JOB_NAME": "bench", "SAT_PROGRESS_FILE": str(progress)}
        sidecar = subprocess.Popen([sys.executable, "-m", "ckpt_engine.metrics"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        system = Path(tmp) / "attempt-1" / "n0" / "system.jsonl"
        while not system.exists() or system.read_text().count("\n") < 2:  # started, first step seen
            time.sleep(0.05)
        recorder = MetricsRecorder(tmp, interval_s=args.interval, job="bench", run="r", attempt=1, node="n0",
                                   say=lambda message: None, series=("training", "checkpoint")).start()
        os.kill(sidecar.pid, signal.SIGSTOP)
        ratios, sidecar_cpu, sidecar_wall = [], 0.0, 0.0
        stat = f"/proc/{sidecar.pid}/stat"
        for pair in range(args.pairs):
            medians = {}
            for name in (("without", "sidecar") if pair % 2 == 0 else ("sidecar", "without")):
                if name == "sidecar":
                    before, started = cpu_seconds(stat), time.perf_counter()
                    os.kill(sidecar.pid, signal.SIGCONT)
                medians[name] = statistics.median(one_round(recorder))
                if name == "sidecar":
                    os.kill(sidecar.pid, signal.SIGSTOP)
                    sidecar_cpu += cpu_seconds(stat) - before
                    sidecar_wall += time.perf_counter() - started
            ratios.append(medians["sidecar"] / medians["without"] - 1)
        os.kill(sidecar.pid, signal.SIGCONT)
        sidecar.send_signal(signal.SIGTERM)
        sidecar.wait(timeout=30)
        recorder.close()
        samples = system.read_text().count("\n")
    ratios.sort()
    quartile = len(ratios) // 4
    print(f"{args.pairs} pairs of {args.steps}-step rounds, interval {args.interval:g} s, {samples} system samples")
    print(f"sidecar (paused between its rounds): overhead_ratio={statistics.median(ratios):+.4f} (median of "
          f"per-pair ratios), middle half {ratios[quartile]:+.4f} .. {ratios[-quartile - 1]:+.4f}; "
          f"sidecar CPU {sidecar_cpu / sidecar_wall:.4f} of one core while running  target < 0.01")


if __name__ == "__main__":
    main()
