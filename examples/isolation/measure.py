#!/usr/bin/env python3
"""Issue 21 isolation measurement (examples/isolation/README.md).

measure.py HQDMUX FLEET.toml LABEL DIR: runs the fleet with an API socket
in DIR, polls `hqdmux ps --json` until the VM named `good` has ended and
prints one JSON line: its packet latency p50/p99, the wall time to its end,
every other VM's billed GPU time, preemptions and queue errors, and the CPU
time of the fleet's `hqdmux-arbiter` thread(s).

measure.py --summary RESULTS.jsonl: the median of each case over rounds."""
import collections, json, os, signal, statistics, subprocess, sys, time


def summary(path):
    rows = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        rows[r["label"].rsplit("-", 1)[0]].append(r)
    print(f"{'case':16} {'n':>2} {'p50 ms':>7} {'p99 ms':>7} {'wall s':>7} "
          f"{'neighbour billed ms (max)':>26} {'arbiter CPU % of wall':>22}")
    for k, v in rows.items():
        med = lambda key: statistics.median([x[key] for x in v])
        billed = [o.get("gpu_time_ms") or 0 for x in v for o in x["others"].values()]
        cpu = statistics.median([100 * x["arbiter_cpu_s"] / x["wall_s"] for x in v])
        print(f"{k:16} {len(v):>2} {med('good_p50_ms'):7.2f} {med('good_p99_ms'):7.2f} "
              f"{med('wall_s'):7.2f} {max(billed) if billed else 0:26.2f} {cpu:22.2f}")


def arbiter_cpu(pid):
    total = 0.0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if not f.read().startswith("hqdmux-arbiter"):
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as g:
                st = g.read().rsplit(")", 1)[1].split()
            total += (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None
    return total


def measure(hq, fleet, label, d):
    sock = os.path.join(d, f"{label}.sock")
    t0 = time.time()
    p = subprocess.Popen([hq, "run", fleet, "-q", "--api-socket", sock],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    views, cpu = {}, 0.0
    while p.poll() is None:
        time.sleep(0.25)
        c = arbiter_cpu(p.pid)
        cpu = c if c is not None else cpu
        try:
            out = subprocess.run([hq, "ps", "--json", "--api-socket", sock],
                                 capture_output=True, text=True, timeout=10).stdout
            for v in json.loads(out)["vms"]:
                views[v["name"]] = v
        except (ValueError, KeyError, subprocess.TimeoutExpired):
            continue
        if views.get("good", {}).get("outcome"):
            break
    wall = time.time() - t0
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    g = views.get("good", {})
    print(json.dumps({
        "label": label, "wall_s": round(wall, 2),
        "good_p50_ms": g.get("latency_p50_ms"), "good_p99_ms": g.get("latency_p99_ms"),
        "good_gpu_ms": g.get("gpu_time_ms"), "good_outcome": g.get("outcome"),
        "arbiter_cpu_s": cpu,
        "others": {n: {k: v.get(k) for k in ("gpu_time_ms", "preemptions", "queue_errors", "quarantined")}
                   for n, v in views.items() if n != "good"},
    }))


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        measure(*sys.argv[1:5])
