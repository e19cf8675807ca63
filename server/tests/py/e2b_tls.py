"""The unmodified e2b SDK against sandkeeperd serving HTTPS (tests/tls.rs).

E2B_API_URL and E2B_SANDBOX_URL are https:// origins; the SDK's transport (pyqwest) trusts the
system's certificates, which SSL_CERT_FILE names: the test's self-signed one.
"""

import asyncio
import importlib.metadata
import os
import sys

from e2b import AsyncSandbox, Sandbox

print("e2b", importlib.metadata.version("e2b"))

sbx = Sandbox.create(timeout=60)
seen = []
out = sbx.commands.run("echo one; sleep 0.2; echo two", on_stdout=seen.append)
assert out.stdout == "one\ntwo\n", out
assert [s.strip() for s in seen] == ["one", "two"], seen
print("ok create, streamed run")
sbx.files.write("/home/user/a.txt", "over tls")
assert sbx.files.read("/home/user/a.txt") == "over tls"
print("ok files.write/read")
assert sbx.is_running()
assert sbx.kill()
assert not sbx.is_running()
print("ok kill")


async def main():
    a = await AsyncSandbox.create(timeout=60)
    r = await a.commands.run("echo async")
    assert r.stdout == "async\n", r
    await a.files.write("/home/user/b.txt", "b")
    assert await a.files.read("/home/user/b.txt") == "b"
    assert await a.kill()


asyncio.run(main())
print("ok async")
print("all steps passed")
# Exit at once, skipping the interpreter's teardown, as e2b_smoke.py does: after AsyncSandbox
# use, the SDK's HTTP client (pyqwest, native code) aborts the process in its teardown now and
# then (SIGABRT, after every step passed; seen here in 1 run of about 10).
sys.stdout.flush()
os._exit(0)
