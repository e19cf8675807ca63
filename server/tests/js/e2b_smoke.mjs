// The official npm `e2b` SDK, unmodified, against sandkeeperd.
//
// Run by server/tests/e2b_sdk_js.rs with NODE_PATH at the installed SDK and E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY (team A) and OTHER_TEAM_KEY (team B). Prints `ok <step>` per step;
// any failure throws, so the exit code is non-zero.

import { createRequire } from 'node:module'
import assert from 'node:assert/strict'

const require = createRequire(process.env.E2B_NODE_MODULES + '/')
const { Sandbox, AuthenticationError, NotFoundError, CommandExitError } = require('e2b')

const step = (name) => console.log(`ok ${name}`)

async function main() {
  console.log(`e2b ${require('e2b/package.json').version}`)
  const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { purpose: 'js' } })
  step(`create ${sbx.sandboxId}`)

  const r = await sbx.commands.run('echo hello')
  assert.equal(r.stdout, 'hello\n')
  step('run echo')

  const seen = []
  const s = await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => seen.push(d) })
  assert.equal(seen.join(''), 'line1\nline2\nline3\n')
  assert.equal(s.exitCode, 0)
  step('streamed onStdout')

  await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  step('exit code 3 rejects with CommandExitError')

  await sbx.files.write('/home/user/js/a.txt', 'hello from js')
  assert.equal(await sbx.files.read('/home/user/js/a.txt'), 'hello from js')
  const names = (await sbx.files.list('/home/user/js')).map((e) => e.name)
  assert.deepEqual(names, ['a.txt'])
  step('files.write/read/list')

  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: process.env.OTHER_TEAM_KEY }), NotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: process.env.OTHER_TEAM_KEY }), false)
  step('another team: NotFound')

  await assert.rejects(Sandbox.create({ apiKey: 'not-a-key' }), AuthenticationError)
  step('bad key: AuthenticationError')

  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  step('kill')
  console.log('all steps passed')
}

main().catch((e) => {
  console.error(e)
  console.log(`FAILED: ${e?.name}: ${e?.message}`)
  process.exit(1)
})
