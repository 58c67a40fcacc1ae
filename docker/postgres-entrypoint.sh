#!/bin/sh
# First start: initdb with POSTGRES_USER / POSTGRES_PASSWORD (scram) and create POSTGRES_DB; every start: run
# the server in the foreground, listening on all interfaces of the container (compose publishes no port for it).
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres-entrypoint: POSTGRES_PASSWORD is empty; set it (docker/.env or the environment): the server accepts password logins only" >&2
    exit 1
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    echo "postgres-entrypoint: initialising $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)" >&2
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" --auth=scram-sha-256 --encoding=UTF8 >&2
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        # single-user mode: no server, no socket, before the real start
        echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
exec postgres -D "$PGDATA"
