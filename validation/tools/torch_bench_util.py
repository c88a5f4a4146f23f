"""What the PyTorch baseline scripts (attention_bench.py, grouped_gemm_bench.py) share: the timing loop of mk-bench and
the measurement file ("mkernel.measurement.v1", written atomically)."""
import datetime
import json
import os
import statistics
import subprocess


def median_us(torch, call, warmup, reps, iters):
    """`warmup` calls, then `reps` loops of `iters` calls between two CUDA events: the median over the loops of
    (loop time / iters), in microseconds (mk-bench's timing)."""
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(reps):
        ev0.record()
        for _ in range(iters):
            call()
        ev1.record()
        ev1.synchronize()
        samples.append(1000.0 * ev0.elapsed_time(ev1) / iters)
    return statistics.median(samples)


def nvidia_driver():
    """The driver version nvidia-smi reports for the first GPU, or "" when it cannot be asked."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def write_measurements(path, system, commit, command, records):
    """`records` with `system` and the run's date, commit and command, to `path` through a temporary file."""
    doc = {"schema": "mkernel.measurement.v1",
           "system": system,
           "run": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": commit,
                   "command": command},
           "records": records}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
