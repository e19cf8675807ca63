"""Two sandkeeperd replicas, through the official `e2b` SDK, unmodified.

Run by server/tests/replicas.rs (one root), hosts.rs (hosts of their own) and
kubernetes_replicas.rs (one namespace) with URL_A and URL_B (the two replicas) and E2B_API_KEY
set. Commands name files relative to their working directory, the workspace on every backend.
Each SDK object is pointed at one replica by the SDK's own `api_url` and `sandbox_url`
parameters; a sandbox made on one is used through the other. Prints one `ok <step>` line per
step; any failure raises, so the exit code is non-zero and the traceback says which step.
"""

import os

from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException

A = os.environ["URL_A"]
B = os.environ["URL_B"]


def on(url):
    return {"api_url": url, "sandbox_url": url}


def step(name):
    print(f"ok {name}", flush=True)


def ids(url, state):
    q = SandboxQuery(state=[state], metadata={"who": "replicas"})
    return [s.sandbox_id for s in Sandbox.list(query=q, **on(url)).next_items()]


def run():
    via_a = Sandbox.create(timeout=120, metadata={"who": "replicas"}, **on(A))
    sid = via_a.sandbox_id
    via_a.files.write("/home/user/a.txt", "written through a")

    # Made on a, used through b: every request b gets for it goes to a.
    via_b = Sandbox.connect(sid, **on(B))
    assert via_b.is_running()
    assert via_b.files.read("/home/user/a.txt") == "written through a"
    via_b.files.write("/home/user/b.txt", "written through b")
    assert via_a.files.read("/home/user/b.txt") == "written through b"
    names = {e.name for e in via_b.files.list("/home/user")}
    assert {"a.txt", "b.txt"} <= names, names
    lines = []
    r = via_b.commands.run(
        "for i in 1 2 3; do echo line $i; sleep 0.1; done; echo err >&2",
        on_stdout=lines.append,
    )
    assert r.exit_code == 0 and r.stderr == "err\n", r
    assert lines == ["line 1\n", "line 2\n", "line 3\n"], lines
    h = via_b.commands.run("sleep 30", background=True)
    assert h.pid in [p.pid for p in via_a.commands.list()]
    assert via_b.commands.kill(h.pid) is True
    assert sid in ids(B, SandboxState.RUNNING)
    assert Sandbox.get_info(sid, **on(B)).sandbox_id == sid
    step("made on a, used through b: files, a streamed command, processes, list, get")

    # Paused through b (a pauses it), resumed through b: b takes it, and its keeper takes the
    # workspace a kept (a hands its key over at its next lease renewal).
    assert via_b.pause() is True
    assert sid in ids(A, SandboxState.PAUSED)
    assert sid in ids(B, SandboxState.PAUSED)
    resumed = Sandbox.connect(sid, timeout=120, **on(B))
    assert resumed.files.read("/home/user/a.txt") == "written through a"
    assert resumed.files.read("/home/user/b.txt") == "written through b"
    assert sid in ids(A, SandboxState.RUNNING)
    # Now on b: a sends its requests there.
    assert via_a.commands.run("cat b.txt").stdout == "written through b"
    via_a.files.write("/home/user/c.txt", "written through a, run on b")
    assert resumed.files.read("/home/user/c.txt") == "written through a, run on b"
    step("paused through b, resumed on b with its files, used through a")

    # Killed through a (it runs on b): gone everywhere.
    assert via_a.kill() is True
    for url in (A, B):
        assert sid not in ids(url, SandboxState.RUNNING) + ids(url, SandboxState.PAUSED)
        try:
            Sandbox.get_info(sid, **on(url))
            raise AssertionError("a killed sandbox has details")
        except NotFoundException:
            pass
    assert Sandbox.kill(sid, **on(B)) is False
    step("killed through a while on b: gone on both")

    # Paused on a and resumed through a again, after b had it: the key goes back.
    back = Sandbox.create(timeout=120, metadata={"who": "replicas"}, **on(B))
    back.files.write("/home/user/d.txt", "made on b")
    assert Sandbox.pause(back.sandbox_id, **on(A)) is True
    again = Sandbox.connect(back.sandbox_id, timeout=120, **on(A))
    assert again.files.read("/home/user/d.txt") == "made on b"
    assert again.commands.run("cat d.txt").stdout == "made on b"
    step("made on b, paused and resumed through a")
    print(f"left running {back.sandbox_id}", flush=True)
    print("all steps passed", flush=True)


if __name__ == "__main__":
    run()
