// Builds what `walcast sync --console` embeds (fanout/sync/console/): the
// client as one ESM file (walcast.js), the console's script (console.js)
// and its page (index.html). `node scripts/bundle.mjs --out DIR` writes
// them elsewhere; the Go test TestConsoleBundleFresh uses that to check the
// committed files are built from the current sources.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const i = process.argv.indexOf('--out');
const out = i > 0 ? process.argv[i + 1] : join(root, '../../sync/console');
mkdirSync(out, { recursive: true });
const common = { bundle: true, format: 'esm', target: 'es2020', minify: true, legalComments: 'none', charset: 'utf8', logLevel: 'warning' };
await build({ ...common, entryPoints: [join(root, 'src/index.ts')], outfile: join(out, 'walcast.js') });
await build({ ...common, entryPoints: [join(root, 'console/console.ts')], outfile: join(out, 'console.js') });
copyFileSync(join(root, 'console/index.html'), join(out, 'index.html'));
