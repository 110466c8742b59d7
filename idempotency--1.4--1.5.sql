-- idempotency 1.4 -> 1.5
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.5'" to load this file. \quit

-- As from 1.4, objects whose signature does not change are kept in place (CREATE OR
-- REPLACE), so that users' views and SQL-standard functions over them survive the update;
-- grants are carried by exact signature.

------------------------------------------------------------------------------
-- The relay on a domain distribution column (issue 41, item 3). The relay calls each
-- shard through a twin with a routing value that falls in that shard, and Citus checks
-- a domain's constraints on that value at both ends of the call. The relay tries values
-- of the domain's base type that pass them (src/pg/citus/citus_meta.hpp); for a shard
-- none of them reaches, it takes the route of one of the events waiting there (pending
-- or dead), which this function reads on the shard's node, as its owner: it reads every
-- role's routes, so it is executable by nobody; the relay functions call it from C.
-- Returns, for each shard of `shards`, the route as text, or NULL where none waits.
------------------------------------------------------------------------------
CREATE FUNCTION idempotency.shard_routes(outbox regclass, shards bigint[]) RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  nodes text[];
  ports integer[];
  commands text[];
  places bigint[];
  routes text[] := array_fill(NULL::text, ARRAY[cardinality(shards)]);
  answer record;
BEGIN
  -- One statement per shard, on the node of its placement ('r' marks a row: a route
  -- may be the empty string).
  SELECT array_agg(p.nodename ORDER BY s.place), array_agg(p.nodeport ORDER BY s.place),
         array_agg(format('SELECT ''r'' || route::text FROM ((SELECT route FROM %1$s WHERE state = ''p'' LIMIT 1) '
                          'UNION ALL (SELECT route FROM %1$s WHERE state = ''x'' LIMIT 1)) w LIMIT 1',
                          shard_name(outbox, s.shardid)) ORDER BY s.place),
         array_agg(s.place ORDER BY s.place)
    INTO nodes, ports, commands, places
    FROM unnest(shards) WITH ORDINALITY AS s(shardid, place)
    CROSS JOIN LATERAL (SELECT d.nodename, d.nodeport FROM pg_dist_shard_placement d
                        WHERE d.shardid = s.shardid AND d.shardstate = 1 LIMIT 1) p;
  IF nodes IS NULL THEN
    RETURN routes;
  END IF;
  FOR answer IN SELECT w.success, w.result, w.n
                FROM master_run_on_worker(nodes, ports, commands, true) WITH ORDINALITY AS w(node_name, node_port, success, result, n) LOOP
    IF answer.success AND answer.result LIKE 'r%' THEN
      routes[places[answer.n]] := substr(answer.result, 2);
    END IF;
  END LOOP;
  RETURN routes;
END $$;
REVOKE ALL ON FUNCTION idempotency.shard_routes(regclass, bigint[]) FROM PUBLIC;
