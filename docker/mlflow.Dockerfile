# syntax=docker/dockerfile:1
# The team tracking server: mlflow (same minor as the project's pin) + the
# PostgreSQL driver. Configured by docker/compose.yaml.
FROM python:3.11-slim

ARG MLFLOW_VERSION=3.17.2
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # Background job runner: unused here, and it slows start-up and shutdown.
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false

RUN pip install "mlflow==${MLFLOW_VERSION}" "psycopg2-binary>=2.9" \
 && useradd --create-home --uid 1000 mlflow \
 && mkdir -p /mlartifacts \
 && chown mlflow /mlartifacts

USER mlflow
WORKDIR /home/mlflow
EXPOSE 5000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=6 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=4)"
# The store URI is assembled from the POSTGRES_* variables at start (so the
# password stays out of the image and the compose file); extra arguments are
# appended to `mlflow server`.
ENV POSTGRES_HOST=postgres POSTGRES_PORT=5432 POSTGRES_DB=mlflow POSTGRES_USER=mlflow \
    MLFLOW_ARTIFACTS_DESTINATION=/mlartifacts MLFLOW_WORKERS=2
ENTRYPOINT ["sh", "-c", "exec mlflow server --backend-store-uri \"${MLFLOW_BACKEND_STORE_URI:-postgresql+psycopg2://${POSTGRES_USER}:${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}@${POSTGRES_HOST}:${POSTGRES_PORT}/${POSTGRES_DB}}\" --artifacts-destination \"$MLFLOW_ARTIFACTS_DESTINATION\" --serve-artifacts --host 0.0.0.0 --port 5000 --workers \"$MLFLOW_WORKERS\" \"$@\"", "mlflow-server"]
