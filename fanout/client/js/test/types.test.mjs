// The client's types: test/types and the React test page
// (test/browser/react-page.tsx, useLive<Item>) compile under tsc --strict
// (typed rows need no casts; each @ts-expect-error is a misuse the types
// must refuse).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

test('typed rows compile without casts, misuses do not', () => {
  const r = spawnSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(root, 'test/types/tsconfig.json')], { encoding: 'utf8' });
  assert.equal(r.status, 0, `tsc -p test/types:\n${r.stdout}${r.stderr}`);
});
