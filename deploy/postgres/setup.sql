-- Prepare a PostgreSQL database for walcast. Run as a superuser (or the
-- database owner on a managed service), in the database to stream from:
--
--   psql -v role=walcast -v password='change-me' -v publication=walcast \
--        -v tables='public.orders, public.customers' -d app -f setup.sql
--
-- Then check the result with:
--   walcast verify --database-url postgres://walcast:change-me@host/app --publication walcast
--
-- For sync nodes that serve snapshots (walcast sync --database-url), add
--   -v sync_role=walcast_sync -v sync_password='change-me-too'
-- to also create a read-only role for them (see the end of this file).
--
-- wal_level must be logical (ALTER SYSTEM SET wal_level = logical; then
-- restart PostgreSQL); this script does not restart anything.

\set ON_ERROR_STOP on

-- The role walcast connects as: it may open replication connections and read
-- the published tables, nothing more.
SELECT format('CREATE ROLE %I LOGIN REPLICATION PASSWORD %L', :'role', :'password')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('ALTER ROLE %I WITH LOGIN REPLICATION', :'role') \gexec

-- The journal lives in its own schema, owned by the walcast role.
SELECT format('CREATE SCHEMA IF NOT EXISTS walcast AUTHORIZATION %I', :'role') \gexec

-- The publication: list the tables to stream. Never publish the walcast schema.
SELECT format('CREATE PUBLICATION %I FOR TABLE %s', :'publication', :'tables')
WHERE NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = :'publication') \gexec

-- SELECT on every published table, and USAGE on their schemas (without it
-- a table outside public cannot be read even with SELECT).
SELECT format('GRANT SELECT ON %s TO %I', :'tables', :'role') \gexec
SELECT DISTINCT format('GRANT USAGE ON SCHEMA %I TO %I', schemaname, :'role')
FROM pg_publication_tables WHERE pubname = :'publication' \gexec

-- The sync nodes' role (only with -v sync_role=…): it reads the published
-- tables for snapshots and nothing else — no REPLICATION, no writes, its
-- sessions read-only by default. Skipped when sync_role is not set.
\if :{?sync_role}
SELECT format('CREATE ROLE %I LOGIN NOREPLICATION PASSWORD %L', :'sync_role', :'sync_password')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'sync_role') \gexec
SELECT format('ALTER ROLE %I WITH LOGIN NOREPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS', :'sync_role') \gexec
SELECT format('ALTER ROLE %I SET default_transaction_read_only = on', :'sync_role') \gexec
SELECT format('GRANT SELECT ON %s TO %I', :'tables', :'sync_role') \gexec
SELECT DISTINCT format('GRANT USAGE ON SCHEMA %I TO %I', schemaname, :'sync_role')
FROM pg_publication_tables WHERE pubname = :'publication' \gexec
\endif

-- Check the result, the sync role included:
--   walcast verify --database-url … --publication walcast --sync-role walcast_sync
