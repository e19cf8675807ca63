"""The official `e2b` SDK, unmodified, against sandkeeperd on its Kubernetes backend.

Run by server/tests/kubernetes.rs (the same environment as e2b_smoke.py) with K8S_MODE set to
`claim` (agent-sandbox claims: pause keeps the claim), `pod-shelf` (plain pods with a shelf:
pause streams the workspace out) or `pod` (plain pods: no pause). Prints
one `ok <step>` line per step and the created sandboxes' ids; any failure raises.
"""

import os

import e2b
from e2b import Sandbox
from e2b.exceptions import NotFoundException, SandboxException


def step(name):
    print(f"ok {name}", flush=True)


def main():
    mode = os.environ["K8S_MODE"]
    sbx = Sandbox.create(timeout=120, envs={"GREETING": "hi"})
    print(f"sandbox {sbx.sandbox_id}", flush=True)
    step("create")

    seen = []
    r = sbx.commands.run("echo $GREETING; for i in 1 2; do echo line$i; done; echo oops >&2",
                         on_stdout=seen.append)
    assert "".join(seen) == "hi\nline1\nline2\n", repr(seen)
    assert r.stderr == "oops\n", repr(r.stderr)
    try:
        sbx.commands.run("exit 3")
        raise AssertionError("exit 3 did not raise")
    except e2b.CommandExitException as e:
        assert e.exit_code == 3, e.exit_code
    step("run with streamed output, exit codes")

    # `cat` started in the background with its stdin open echoes what is sent, in order, and
    # ends once stdin is closed (the exec's stdin channel fed while it runs, then closed).
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "one ")
    sbx.commands.send_stdin(h.pid, "two")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.exit_code == 0, r
    assert r.stdout == "one two", repr(r.stdout)
    step("stdin: send_stdin twice, close_stdin, wait")

    sbx.files.write("/home/user/notes/a.txt", "in the pod")
    assert sbx.files.read("/home/user/notes/a.txt") == "in the pod"
    assert [e.name for e in sbx.files.list("/home/user/notes")] == ["a.txt"]
    assert sbx.commands.run("cat notes/a.txt").stdout == "in the pod"
    sbx.files.remove("/home/user/notes/a.txt")
    assert not sbx.files.exists("/home/user/notes/a.txt")
    sbx.files.write("/home/user/kept.txt", "kept across pause")
    step("files")

    if mode in ("claim", "pod-shelf"):
        assert sbx.pause() is True
        assert not sbx.is_running()
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert resumed.is_running()
        assert resumed.files.read("/home/user/kept.txt") == "kept across pause"
        assert resumed.commands.run("cat kept.txt").stdout == "kept across pause"
        step("pause, connect resumes it with its files")
        assert resumed.pause() is True  # killed below while paused: nothing of it may stay
    else:
        try:
            sbx.pause()
            raise AssertionError("pod mode paused")
        except SandboxException as e:
            assert "cannot" in str(e) or "not supported" in str(e), str(e)
        assert sbx.is_running()
        assert sbx.files.read("/home/user/kept.txt") == "kept across pause"
        try:
            Sandbox.create(lifecycle={"on_timeout": "pause"})
            raise AssertionError("pod mode took autoPause")
        except SandboxException as e:  # the SDK's create raises 400 as this
            assert "400: autoPause" in str(e), str(e)
        step("pod mode refuses pause and autoPause, and runs on")

    other = Sandbox.create()
    print(f"sandbox {other.sandbox_id}", flush=True)
    assert other.commands.run("ls kept.txt 2>/dev/null || echo none").stdout == "none\n"
    step("a second sandbox has its own workspace")

    assert Sandbox.kill(sbx.sandbox_id) is True
    try:
        Sandbox.get_info(sbx.sandbox_id)
        raise AssertionError("a killed sandbox is still there")
    except NotFoundException:
        pass
    try:
        Sandbox.connect(sbx.sandbox_id)
        raise AssertionError("a killed sandbox was resumed")
    except NotFoundException:
        pass
    step("kill (of a paused sandbox, where it pauses)")
    print(f"left running {other.sandbox_id}", flush=True)
    print("all steps passed", flush=True)


if __name__ == "__main__":
    main()
    # Past the interpreter's teardown, as e2b_smoke.py (the SDK's native client can abort it).
    os._exit(0)
