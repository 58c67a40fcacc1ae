#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster for an MLflow backend store.
#
#   scripts/start_postgres.sh DATA_DIR [PORT]     start (idempotent); prints the URI on stdout
#   scripts/start_postgres.sh --stop DATA_DIR     stop it (fast shutdown)
#   scripts/start_postgres.sh --install           only make sure the server binaries are installed
#
# Listens on 127.0.0.1 only (no unix socket), creates database "mlflow", password
# auth (scram). Tuned for throwaway use: fsync off, so do not keep data you care
# about in it. Installs the Debian package "postgresql" with apt-get when no
# /usr/lib/postgresql/*/bin/pg_ctl exists (set PG_NO_INSTALL=1 to forbid that).
# When run as root, the cluster runs as the OS user $PG_OS_USER (default postgres).
#
# Environment: PG_USER (default postgres), PG_PASSWORD (default mlflow),
#              PG_DB (default mlflow), PG_OS_USER (default postgres).
# Only the SQLAlchemy URI (postgresql+psycopg2://...) goes to stdout, so: URI=$(scripts/start_postgres.sh runs/postgres 55432)
set -euo pipefail

PG_USER=${PG_USER:-postgres}
PG_PASSWORD=${PG_PASSWORD:-mlflow}
PG_DB=${PG_DB:-mlflow}
PG_OS_USER=${PG_OS_USER:-postgres}

log() { echo "start_postgres: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { sed -n '4,6p' "$0" | sed 's/^# *//' >&2; exit 2; }

find_bindir() {
    local d
    # highest installed major version first
    for d in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5,5 -rn); do
        [[ -x $d/pg_ctl && -x $d/initdb ]] && { echo "$d"; return 0; }
    done
    return 1
}

install_postgres() {
    [[ ${PG_NO_INSTALL:-0} == 1 ]] && die "PostgreSQL server binaries not found and PG_NO_INSTALL=1"
    command -v apt-get >/dev/null || die "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin and no apt-get; install PostgreSQL"
    [[ $(id -u) == 0 ]] || die "PostgreSQL server binaries not found; install them: sudo apt-get install -y postgresql"
    log "installing PostgreSQL with apt-get (one-time) ..."
    export DEBIAN_FRONTEND=noninteractive
    # Do not let the package create and start its own 'main' cluster on 5432.
    apt_install() { apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold "$@" >&2 \
        || { apt-get update >&2 && apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold "$@" >&2; }; }
    apt_install postgresql-common
    sed -ri 's/^#?\s*create_main_cluster\s*=.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf
    apt_install postgresql
}

# as_pg CMD...: run CMD as the cluster owner (dedicated OS user when we are root)
as_pg() {
    if [[ $(id -u) == 0 ]]; then
        (cd / && runuser -u "$PG_OS_USER" -- "$@")
    else
        "$@"
    fi
}

[[ $# -ge 1 ]] || usage
if [[ $1 == --install ]]; then
    BINDIR=$(find_bindir) || { install_postgres; BINDIR=$(find_bindir) || die "PostgreSQL install did not provide pg_ctl"; }
    log "server binaries: $BINDIR"
    exit 0
fi
STOP=0
if [[ $1 == --stop ]]; then STOP=1; shift; fi
[[ $# -ge 1 ]] || usage
DATA_DIR=$(realpath -m -- "$1")
PORT=${2:-5432}
[[ $PORT =~ ^[0-9]+$ ]] || die "PORT must be a number, got '$PORT'"

BINDIR=$(find_bindir) || { install_postgres; BINDIR=$(find_bindir) || die "PostgreSQL install did not provide pg_ctl"; }

if [[ $STOP == 1 ]]; then
    if [[ -f $DATA_DIR/postmaster.pid ]]; then
        as_pg "$BINDIR/pg_ctl" -D "$DATA_DIR" -m fast -w stop >&2
    else
        log "not running ($DATA_DIR)"
    fi
    exit 0
fi

if [[ $(id -u) == 0 ]]; then
    id -u "$PG_OS_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_OS_USER"
    mkdir -p "$DATA_DIR"
    chown "$PG_OS_USER" "$DATA_DIR"
    as_pg test -w "$DATA_DIR" -a -x "$DATA_DIR" \
        || die "OS user '$PG_OS_USER' cannot use $DATA_DIR: a parent directory is not searchable (chmod o+x it) or choose another DATA_DIR"
else
    mkdir -p "$DATA_DIR"
fi

# 1. initdb (once)
if [[ ! -f $DATA_DIR/PG_VERSION ]]; then
    [[ -z $(ls -A "$DATA_DIR") ]] || die "$DATA_DIR is not empty and is not a PostgreSQL data directory"
    log "initdb $DATA_DIR"
    pwfile=$(mktemp)
    trap 'rm -f "$pwfile"' EXIT
    printf '%s\n' "$PG_PASSWORD" >"$pwfile"
    [[ $(id -u) == 0 ]] && chown "$PG_OS_USER" "$pwfile"
    as_pg "$BINDIR/initdb" -D "$DATA_DIR" -U "$PG_USER" --pwfile="$pwfile" \
        --auth=scram-sha-256 -E UTF8 --locale=C --no-sync --no-instructions >"$DATA_DIR.initdb.log" 2>&1 \
        || { cat "$DATA_DIR.initdb.log" >&2; die "initdb failed"; }
    rm -f "$pwfile" "$DATA_DIR.initdb.log"
    as_pg tee -a "$DATA_DIR/postgresql.conf" >/dev/null <<'EOF'
# --- attention-distill throwaway settings ---
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 50
EOF
fi

# 2. start (unless already running)
if as_pg "$BINDIR/pg_ctl" -D "$DATA_DIR" status >/dev/null 2>&1; then
    running_port=$(sed -n 4p "$DATA_DIR/postmaster.pid")
    [[ $running_port == "$PORT" ]] \
        || die "already running from $DATA_DIR on port $running_port, not $PORT; stop it: $0 --stop $DATA_DIR"
    log "already running (pid $(head -1 "$DATA_DIR/postmaster.pid"), port $PORT)"
else
    log "starting on 127.0.0.1:$PORT (log: $DATA_DIR/server.log)"
    as_pg "$BINDIR/pg_ctl" -D "$DATA_DIR" -l "$DATA_DIR/server.log" -o "-p $PORT" -w -t 60 start >/dev/null \
        || { tail -n 20 "$DATA_DIR/server.log" >&2 || true; die "PostgreSQL did not start (port $PORT in use?)"; }
fi

# 3. database (once)
psql_() { as_pg env PGPASSWORD="$PG_PASSWORD" "$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U "$PG_USER" -d postgres -v ON_ERROR_STOP=1 -qtAX "$@"; }
if [[ -z $(psql_ -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'") ]]; then
    psql_ -c "CREATE DATABASE \"$PG_DB\"" >/dev/null
    log "created database $PG_DB"
fi

# Driver named explicitly: SQLAlchemy >= 2.1 maps plain postgresql:// to psycopg (v3),
# while the project installs psycopg2-binary.
echo "postgresql+psycopg2://$PG_USER:$PG_PASSWORD@127.0.0.1:$PORT/$PG_DB"
