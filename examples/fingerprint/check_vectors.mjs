// Computes every vector's digest from its "input" with fingerprint.mjs and compares it
// (and the canonical text) with the file; exits 1 on any mismatch.
//
//   node examples/fingerprint/check_vectors.mjs test/fingerprint_vectors.json
import { readFileSync } from 'node:fs';
import { canonicalJson, fingerprint } from './fingerprint.mjs';

const file = process.argv[2] ?? new URL('../../test/fingerprint_vectors.json', import.meta.url);
// The file's own numbers do not matter (its fields are strings), so JSON.parse will do.
const vectors = JSON.parse(readFileSync(file, 'utf8'));
let mismatches = 0;
for (const v of vectors) {
  let canonical, digest;
  try {
    canonical = canonicalJson(v.input);
    digest = fingerprint(v.input);
  } catch (e) {
    canonical = digest = `error: ${e.message}`;
  }
  if (canonical !== v.canonical || digest !== v.sha256) {
    mismatches++;
    const shown = (text) => JSON.stringify(text.length > 200 ? text.slice(0, 200) + '...' : text);
    console.log(`MISMATCH ${v.name}`);
    console.log(`  canonical ${shown(canonical)}, expected ${shown(v.canonical)}`);
    console.log(`  sha256    ${digest}, expected ${v.sha256}`);
  }
}
console.log(`${vectors.length} vectors, ${mismatches} mismatches`);
process.exit(vectors.length > 0 && mismatches === 0 ? 0 : 1);
