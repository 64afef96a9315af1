#!/bin/sh
# Prepares the compose demo database. The postgres image runs this once, from
# /docker-entrypoint-initdb.d, when its data directory is empty: it creates a
# demo table and then runs deploy/postgres/setup.sql (the walcast role, the
# journal schema, the publication and the grants) with its psql variables
# taken from SETUP_* environment variables.
#
# Outside compose: POSTGRES_USER, POSTGRES_DB and the usual PG* variables say
# where to connect; SETUP_SQL names setup.sql.
set -eu

: "${SETUP_SQL:=/walcast/setup.sql}"
: "${SETUP_ROLE:=walcast}"
: "${SETUP_PASSWORD:?set SETUP_PASSWORD to the walcast role's password}"
: "${SETUP_PUBLICATION:=walcast}"
: "${SETUP_TABLES:=public.orders}"

psql -X -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE TABLE IF NOT EXISTS public.orders (
    id         bigserial PRIMARY KEY,
    customer   text NOT NULL,
    status     text NOT NULL DEFAULT 'new',
    total      numeric(12, 2),
    created_at timestamptz NOT NULL DEFAULT now()
);
SQL

psql -X -q -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v role="$SETUP_ROLE" -v password="$SETUP_PASSWORD" \
    -v publication="$SETUP_PUBLICATION" -v tables="$SETUP_TABLES" \
    -f "$SETUP_SQL"
