-- The published fingerprint vectors (test/fingerprint_vectors.json, docs/fingerprint.md)
-- through jsonb: idem_fingerprint(input::jsonb) must be each vector's digest.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- pg_regress runs psql in the source tree, so the path is relative to it.
\set vectors `cat test/fingerprint_vectors.json`

-- Only counts are printed, and the names of the vectors that do not match (none).
SELECT count(*) AS vectors,
       count(*) FILTER (WHERE encode(idem_fingerprint((v->>'input')::jsonb), 'hex')
                              <> v->>'sha256') AS mismatches,
       count(*) FILTER (WHERE encode(sha256(convert_to(v->>'canonical', 'UTF8')), 'hex')
                              <> v->>'sha256') AS bad_digests_in_file,
       coalesce(string_agg(v->>'name', ', ') FILTER (
                  WHERE encode(idem_fingerprint((v->>'input')::jsonb), 'hex') <> v->>'sha256'),
                '') AS mismatched
FROM jsonb_array_elements(:'vectors'::jsonb) AS v;
