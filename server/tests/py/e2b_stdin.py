"""A command's standard input through the official `e2b` SDK, unmodified, against sandkeeperd.

Run by server/tests/e2b_stdin.rs with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set. Prints
one `ok <step>` line per step; any failure raises, so the exit code is non-zero and the
traceback says which step.
"""

import os
import sys

from e2b import Sandbox
from e2b.exceptions import NotFoundException, SandboxException


def step(name):
    print(f"ok {name}", flush=True)


def main():
    sbx = Sandbox.create(timeout=120)

    # `cat` started in the background with its stdin open echoes what is sent, in order, and
    # ends with 0 once stdin is closed.
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello ")
    sbx.commands.send_stdin(h.pid, b"world\n")
    h.send_stdin("through the handle\n")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.exit_code == 0, r
    assert r.stdout == "hello world\nthrough the handle\n", repr(r.stdout)
    step("stdin: send_stdin twice, close_stdin, wait")

    # stream_input (a client stream) sends each piece in order; its end leaves stdin open.
    s = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(s.pid, ["streamed ", b"in ", "pieces\n"])
    sbx.commands.send_stdin(s.pid, "then sent\n")
    sbx.commands.close_stdin(s.pid)
    r = s.wait()
    assert r.stdout == "streamed in pieces\nthen sent\n", repr(r.stdout)
    step("stdin: stream_input in pieces, then send_stdin, close_stdin")

    # Input to a pid that is not there raises the SDK's not-found exception.
    try:
        sbx.commands.send_stdin(999999, "nobody")
        raise AssertionError("input to an unknown pid did not raise")
    except NotFoundException:
        pass
    try:
        sbx.commands.close_stdin(999999)
        raise AssertionError("closing the stdin of an unknown pid did not raise")
    except NotFoundException:
        pass
    try:
        sbx.commands.stream_input(999999, ["nobody"])
        raise AssertionError("a stream to an unknown pid did not raise")
    except NotFoundException:
        pass
    step("stdin: an unknown pid raises NotFoundException")

    # A command started without stdin refuses input, saying why.
    plain = sbx.commands.run("sleep 30", background=True)
    try:
        sbx.commands.send_stdin(plain.pid, "ignored")
        raise AssertionError("input to a command without stdin did not raise")
    except SandboxException as e:
        assert "stdin" in str(e), str(e)
    assert sbx.commands.kill(plain.pid) is True
    step("stdin: a command started without stdin refuses input")

    # `head -c 5` ends after five bytes; input sent later finds it gone.
    head = sbx.commands.run("head -c 5", background=True, stdin=True)
    sbx.commands.send_stdin(head.pid, "hello, and more")
    assert head.wait().stdout == "hello"
    try:
        sbx.commands.send_stdin(head.pid, "late")
        raise AssertionError("input to an ended command did not raise")
    except NotFoundException:
        pass
    step("stdin: a command that ended refuses input")

    assert sbx.kill() is True
    print("all steps passed", flush=True)


if __name__ == "__main__":
    try:
        main()
        # Exit at once, skipping the interpreter's teardown (as e2b_smoke.py does).
        sys.stdout.flush()
        os._exit(0)
    except Exception as e:  # noqa: BLE001 - the test reads the exit code and this line
        import traceback

        traceback.print_exc()
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
