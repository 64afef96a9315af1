// The bundle size the README states: each entry point, bundled and
// minified with esbuild (es2020, ESM; react left out of the react entry,
// which an app has anyway) and gzipped (level 9), must stay within the
// bound in the README's "Size" table, and the size the table states must
// be the real one within 10% (update the table when it moves).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const readme = readFileSync(join(root, 'README.md'), 'utf8');

async function size(entry, external) {
  const r = await build({
    entryPoints: [join(root, entry)], bundle: true, format: 'esm', target: 'es2020', minify: true, legalComments: 'none',
    write: false, external, logLevel: 'silent',
  });
  const b = r.outputFiles[0].contents;
  return { min: b.length, gzip: gzipSync(b, { level: 9 }).length };
}

for (const [name, entry, external] of [
  ['@walcast/client', 'src/index.ts', []],
  ['@walcast/client/react', 'src/react.ts', ['react']],
]) {
  test(`${name}: minified and gzipped within the README's bound`, async () => {
    // | `name` | 19.9 kB | 6.8 kB | 8 kB |
    const row = new RegExp('^\\| `' + name.replace(/[/.]/g, '\\$&') + '` \\| ([\\d.]+) kB \\| ([\\d.]+) kB \\| ([\\d.]+) kB \\|$', 'm').exec(readme);
    assert.ok(row, `README.md's size table has no row for ${name}`);
    const [statedMin, statedGzip, bound] = row.slice(1).map((v) => Number(v) * 1000);
    const got = await size(entry, external);
    assert.ok(got.gzip <= bound, `${name} is ${got.gzip} bytes minified and gzipped, past the bound of ${bound}: make it smaller, or raise the bound in README.md knowingly`);
    for (const [what, stated, real] of [['minified', statedMin, got.min], ['minified and gzipped', statedGzip, got.gzip]]) {
      assert.ok(Math.abs(stated - real) <= real / 10, `README.md states ${name} ${what} as ${stated / 1000} kB; it is ${(real / 1000).toFixed(1)} kB: update the table`);
    }
  });
}
