"""The SDK side of sandkeeperd's figures (docs/performance.md, "sandkeeperd"), through the
official, unmodified `e2b` SDK. Run by server/perf/run.sh, which starts the server and sets
E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (as server/tests/e2b_sdk.rs does: no E2B_DEBUG, no
E2B_DOMAIN) and SERVER_PID.

    sdk_perf.py latency ROUNDS      server.create_to_ready_ms (fresh and warm), server.exec_ms,
                                    interleaved with the library's (EXEC_DIRECT: the
                                    exec_direct example, EXEC_DIRECT_ROOT: its root)
    sdk_perf.py throughput CLIENTS SECONDS
                                    server.requests_per_sec, CPU per request
    sdk_perf.py replicas ROUNDS     two replicas on one root (`--fleet`; the second's origin in
                                    URL_B): a create and kill, and `commands.run("true")` on a
                                    sandbox of the first, through it and (forwarded) through
                                    the second, interleaved

Prints one `name value` line per figure; any failure raises (non-zero exit).
"""

import asyncio
import importlib.metadata
import math
import os
import resource
import subprocess
import sys
import time
import urllib.request

from e2b import AsyncSandbox, Sandbox

SESSION_KEY = "sandkeeper.session"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(xs, p):
    """The p-th percentile (nearest rank), as the Rust side computes it."""
    xs = sorted(xs)
    rank = math.ceil(p / 100 * len(xs))
    return xs[min(max(rank, 1), len(xs)) - 1]


# The figures' prefix: `server` for sandkeeperd, another for a variant of it (run.sh).
PREFIX = os.environ.get("FIGURE_PREFIX", "server")


def figure(name, value):
    print(f"{PREFIX}.{name} {value}", flush=True)


def report(name, xs):
    name = f"{PREFIX}.{name}"
    print(f"{name}_p50 {percentile(xs, 50):.3f}")
    print(f"{name}_p99 {percentile(xs, 99):.3f}", flush=True)


def ms_since(t0):
    return (time.perf_counter() - t0) * 1e3


def server_cpu():
    """The server process's CPU seconds: its own (utime + stime), and that of the children it
    reaped (cutime + cstime: bubblewrap, each sandbox's init and what ran in it)."""
    with open(f"/proc/{os.environ['SERVER_PID']}/stat") as f:
        # The command name may hold spaces: the fields after it start past the last ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK


def client_cpu():
    """This process's CPU seconds (the SDK clients, their Python and their transport's threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def machine_busy():
    """Busy and total jiffies of the whole machine (/proc/stat's cpu line)."""
    with open("/proc/stat") as f:
        xs = [int(x) for x in f.readline().split()[1:]]
    idle = xs[3] + xs[4]
    return sum(xs) - idle, sum(xs)


def server_histogram_means():
    """The server's own mean create and kill seconds so far (its /metrics histograms)."""
    url = os.environ["E2B_API_URL"] + "/metrics"
    with urllib.request.urlopen(url) as resp:
        text = resp.read().decode()
    got = {}
    for line in text.splitlines():
        line = line.removeprefix("sandkeeperd_")
        for name in ("create_seconds", "kill_seconds"):
            for part in ("sum", "count"):
                if line.startswith(f"{name}_{part}{{") and (
                    'outcome="ok"' in line or 'outcome="api"' in line
                ):
                    got[(name, part)] = float(line.rsplit(" ", 1)[1])
    return got


def mean_between(before, after, name):
    n = after.get((name, "count"), 0) - before.get((name, "count"), 0)
    s = after.get((name, "sum"), 0) - before.get((name, "sum"), 0)
    return s / n * 1e3 if n else float("nan")


def latency(rounds):
    # A sandbox whose keeper sandbox is up (its init started by a first command) for the
    # warm creates, which name its session; it also runs the timed commands.
    holder = Sandbox.create(timeout=600, metadata={SESSION_KEY: "warm"})
    holder.commands.run("true")

    fresh, fresh_kill, warm, warm_kill, first_run = [], [], [], [], []
    before = server_histogram_means()
    for _ in range(rounds):
        t0 = time.perf_counter()
        sbx = Sandbox.create(timeout=120)
        fresh.append(ms_since(t0))
        # A fresh sandbox's first command starts its init (its bubblewrap).
        t0 = time.perf_counter()
        sbx.commands.run("true")
        first_run.append(ms_since(t0))
        t0 = time.perf_counter()
        sbx.kill()
        fresh_kill.append(ms_since(t0))

        t0 = time.perf_counter()
        sbx = Sandbox.create(timeout=120, metadata={SESSION_KEY: "warm"})
        warm.append(ms_since(t0))
        t0 = time.perf_counter()
        sbx.kill()
        warm_kill.append(ms_since(t0))
    after = server_histogram_means()

    # The commands, each round interleaved with one of exec_direct --serve (the library's exec
    # of the same argv, of `true`, and the host's spawns), so the load of the machine falls on
    # both sides alike.
    direct = subprocess.Popen(
        [os.environ["EXEC_DIRECT"], "--serve", "0", os.environ["EXEC_DIRECT_ROOT"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert direct.stdout.readline().strip() == "ready"
    runs, lib = [], [[], [], [], []]
    for _ in range(rounds * 2):
        t0 = time.perf_counter()
        r = holder.commands.run("true")
        runs.append(ms_since(t0))
        assert r.exit_code == 0, r
        direct.stdin.write("round\n")
        direct.stdin.flush()
        for xs, x in zip(lib, direct.stdout.readline().split(), strict=True):
            xs.append(float(x))
    direct.stdin.close()
    assert direct.wait() == 0, "exec_direct --serve failed"
    holder.kill()

    report("create_to_ready_ms", fresh)
    report("create_to_ready_warm_ms", warm)
    report("kill_ms", fresh_kill)
    report("kill_warm_ms", warm_kill)
    report("first_exec_ms", first_run)
    report("exec_ms", runs)
    for name, xs in zip(
        ["lib_exec_bash_ms", "lib_exec_true_ms", "host_spawn_true_ms", "host_spawn_bash_ms"], lib
    ):
        report(name, xs)
    p50, lib_p50, spawn_p50 = percentile(runs, 50), percentile(lib[0], 50), percentile(lib[2], 50)
    figure("exec_vs_lib", f"{p50 / lib_p50:.3f}")
    figure("exec_vs_host_spawn_true", f"{p50 / spawn_p50:.3f}")
    figure("lib_exec_bash_vs_host_spawn_true", f"{lib_p50 / spawn_p50:.3f}")
    # The server's own view (its /metrics histograms, fresh and warm together): the mean.
    figure("create_server_side_ms_mean", f"{mean_between(before, after, 'create_seconds'):.3f}")
    figure("kill_server_side_ms_mean", f"{mean_between(before, after, 'kill_seconds'):.3f}")


async def client(deadline, counts, errors):
    while time.perf_counter() < deadline:
        try:
            sbx = await AsyncSandbox.create(timeout=120)
            r = await sbx.commands.run("true")
            assert r.exit_code == 0, r
            await sbx.files.write("a.txt", "hello")
            await sbx.kill()
            counts[0] += 1
        except Exception as e:  # counted and shown, not hidden
            errors.append(repr(e))
            if len(errors) > 20:
                raise


async def throughput_async(clients, seconds):
    # Warm-up, not measured: the clients' connections, the first cycles.
    counts, errors = [0], []
    warm = time.perf_counter() + 3
    await asyncio.gather(*(client(warm, counts, errors) for _ in range(clients)))

    counts, errors = [0], []
    cpu0, children0 = server_cpu()
    busy0, total0 = machine_busy()
    client0 = client_cpu()
    t0 = time.perf_counter()
    await asyncio.gather(*(client(t0 + seconds, counts, errors) for _ in range(clients)))
    took = time.perf_counter() - t0
    cpu1, children1 = server_cpu()
    busy1, total1 = machine_busy()
    own = client_cpu() - client0
    return (
        counts[0], errors, took, cpu1 - cpu0, children1 - children0, own,
        busy1 - busy0, total1 - total0,
    )


def throughput(clients, seconds):
    cycles, errors, took, cpu, children, client, busy, total = asyncio.run(
        throughput_async(clients, seconds)
    )
    # create, run, write, kill: one HTTP request each (POST /v2/sandboxes, Start, POST /files,
    # DELETE /sandboxes/{id}, as the SDK's own `pyqwest.access` log shows).
    requests = cycles * 4
    figure("throughput_clients", f"{clients}")
    figure("throughput_seconds", f"{took:.1f}")
    figure("cycles", f"{cycles}")
    figure("errors", f"{len(errors)}")
    for e in errors[:5]:
        print(f"  error: {e}", file=sys.stderr)
    figure("cycles_per_sec", f"{cycles / took:.1f}")
    figure("requests_per_sec", f"{requests / took:.1f}")
    figure("cpu_ms_per_request", f"{cpu * 1e3 / requests:.3f}")
    figure("children_cpu_ms_per_cycle", f"{children * 1e3 / cycles:.3f}")
    # Shares of the machine's busy CPU time over the run (the rest: other processes, the
    # kernel's own threads).
    figure("cpu_share_of_machine", f"{cpu / (busy / CLK_TCK):.3f}")
    figure("children_cpu_share_of_machine", f"{children / (busy / CLK_TCK):.3f}")
    figure("client_cpu_share_of_machine", f"{client / (busy / CLK_TCK):.3f}")
    figure("machine_busy_fraction", f"{busy / total:.3f}")


def replicas(rounds):
    b = {"api_url": os.environ["URL_B"], "sandbox_url": os.environ["URL_B"]}
    creates, kills = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        sbx = Sandbox.create(timeout=120)
        creates.append(ms_since(t0))
        t0 = time.perf_counter()
        sbx.kill()
        kills.append(ms_since(t0))
    report("fleet_create_to_ready_ms", creates)
    report("fleet_kill_ms", kills)

    here = Sandbox.create(timeout=600)
    there = Sandbox.connect(here.sandbox_id, **b)
    here.commands.run("true")
    there.commands.run("true")
    direct, forwarded = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        here.commands.run("true")
        direct.append(ms_since(t0))
        t0 = time.perf_counter()
        there.commands.run("true")
        forwarded.append(ms_since(t0))
    here.kill()
    report("fleet_exec_ms", direct)
    report("forwarded_exec_ms", forwarded)
    figure(
        "forwarded_vs_direct",
        f"{percentile(forwarded, 50) / percentile(direct, 50):.3f}",
    )


def main():
    print(f"e2b {importlib.metadata.version('e2b')}", file=sys.stderr)
    what = sys.argv[1]
    if what == "latency":
        latency(int(sys.argv[2]))
    elif what == "throughput":
        throughput(int(sys.argv[2]), float(sys.argv[3]))
    elif what == "replicas":
        replicas(int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown: {what}")


if __name__ == "__main__":
    main()
