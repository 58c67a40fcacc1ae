#!/usr/bin/env bash
# `make server`: a local MLflow tracking server (UI + REST API + artifact proxy).
#
# Backend store, first that applies:
#   MLFLOW_BACKEND_STORE_URI           if set, used as is
#   PostgreSQL in runs/postgres        if PostgreSQL server binaries are installed
#                                      (scripts/start_postgres.sh, port $PG_PORT, default 55432)
#   sqlite:///runs/server.db           otherwise (or with MLFLOW_SERVER_BACKEND=sqlite)
# Artifacts: runs/server-artifacts (served through the server: --serve-artifacts).
# Binds 127.0.0.1:$MLFLOW_PORT (default 5000). Ctrl-C stops the server; a PostgreSQL
# that this script started is stopped too (set KEEP_POSTGRES=1 to keep it running).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS_DIR=$(realpath -m "${RUNS_DIR:-runs}")
HOST=${MLFLOW_HOST:-127.0.0.1}
PORT=${MLFLOW_PORT:-5000}
PG_PORT=${PG_PORT:-55432}
BACKEND=${MLFLOW_SERVER_BACKEND:-auto}   # auto | postgres | sqlite
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $ROOT/.venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi

log() { echo "mlflow_server: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

"$PYTHON" -c 'import mlflow' 2>/dev/null || die "mlflow is not importable with $PYTHON; run 'make venv' first"
case $BACKEND in auto|postgres|sqlite) ;; *) die "MLFLOW_SERVER_BACKEND must be auto, postgres or sqlite (got '$BACKEND')";; esac
mkdir -p "$RUNS_DIR/server-artifacts"

have_postgres() {
    compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null && "$PYTHON" -c 'import psycopg2' 2>/dev/null
}

STARTED_PG=0
if [[ -n ${MLFLOW_BACKEND_STORE_URI:-} ]]; then
    STORE=$MLFLOW_BACKEND_STORE_URI
elif [[ $BACKEND == postgres ]] || { [[ $BACKEND == auto ]] && have_postgres; }; then
    "$PYTHON" -c 'import psycopg2' 2>/dev/null || die "psycopg2 missing: $PYTHON -m pip install psycopg2-binary"
    pg_was_running=0
    [[ -f $RUNS_DIR/postgres/postmaster.pid ]] && kill -0 "$(head -1 "$RUNS_DIR/postgres/postmaster.pid")" 2>/dev/null && pg_was_running=1
    STORE=$(scripts/start_postgres.sh "$RUNS_DIR/postgres" "$PG_PORT")
    [[ $pg_was_running == 0 ]] && STARTED_PG=1
else
    [[ $BACKEND == auto ]] && log "PostgreSQL not available (server binaries or psycopg2 missing): using sqlite"
    STORE=sqlite:///$RUNS_DIR/server.db
fi

stop_pg() {
    if [[ $STARTED_PG == 1 && ${KEEP_POSTGRES:-0} != 1 ]]; then
        scripts/start_postgres.sh --stop "$RUNS_DIR/postgres" || true
    fi
}
trap stop_pg EXIT

log "backend store: $(sed -E 's#(//[^:/@]*):[^@]*@#\1:***@#' <<<"$STORE")"
log "artifacts:     $RUNS_DIR/server-artifacts"
cat <<EOF

  MLflow UI:  http://$HOST:$PORT
  To log pipeline runs to this server, in another shell:

    export MLFLOW_TRACKING_URI=http://$HOST:$PORT

EOF

# Job execution (MLflow's background job runner) is not used by this project and
# slows startup; enable it with MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
"$PYTHON" -m mlflow server \
    --backend-store-uri "$STORE" \
    --artifacts-destination "$RUNS_DIR/server-artifacts" \
    --serve-artifacts \
    --host "$HOST" --port "$PORT" --workers 1 "$@"
