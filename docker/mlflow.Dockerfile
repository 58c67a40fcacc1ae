# The team tracking server: mlflow (same minor as the project's pin) + the PostgreSQL driver, user `mlflow`.
# Configured by docker/compose.yaml; build context docker/ (it copies only certs/, see docker/.dockerignore).
# Build arguments as docker/Dockerfile.cpu: BASE_IMAGE (python:3.11-slim, or a Debian bookworm image: python3
# comes from apt when absent), CA_CERTS (a folder of *.crt trusted by pip during the build). No `# syntax=` line.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG MLFLOW_VERSION=3.17.2
ARG CA_CERTS=certs
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive \
    # Background job runner: unused here, and it slows start-up and shutdown.
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    PATH=/opt/mlflow/bin:$PATH

COPY ${CA_CERTS}/ /tmp/certs/
RUN set -e; \
    if ! command -v python3 >/dev/null; then \
        apt-get update; apt-get install -y --no-install-recommends python3 python3-venv; rm -rf /var/lib/apt/lists/*; fi; \
    if ls /tmp/certs/*.crt >/dev/null 2>&1; then \
        bundle=/etc/ssl/certs/ca-certificates.crt; [ -f "$bundle" ] || bundle=/dev/null; \
        cat "$bundle" /tmp/certs/*.crt > /tmp/ca.pem; export PIP_CERT=/tmp/ca.pem; fi; \
    python3 -m venv /opt/mlflow; \
    pip install "mlflow==${MLFLOW_VERSION}" "psycopg2-binary>=2.9"; \
    rm -rf /tmp/ca.pem /tmp/certs; \
    useradd --create-home --uid 1000 mlflow; \
    mkdir -p /mlartifacts; chown mlflow /mlartifacts

USER mlflow
WORKDIR /home/mlflow
VOLUME ["/mlartifacts"]
EXPOSE 5000
HEALTHCHECK --interval=5s --timeout=5s --start-period=60s --retries=12 \
    CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=4)"
# The store URI is assembled from the POSTGRES_* variables at start (so the
# password stays out of the image and the compose file); extra arguments are
# appended to `mlflow server`.
ENV POSTGRES_HOST=postgres POSTGRES_PORT=5432 POSTGRES_DB=mlflow POSTGRES_USER=mlflow \
    MLFLOW_ARTIFACTS_DESTINATION=/mlartifacts MLFLOW_WORKERS=2
ENTRYPOINT ["sh", "-c", "exec mlflow server --backend-store-uri \"${MLFLOW_BACKEND_STORE_URI:-postgresql+psycopg2://${POSTGRES_USER}:${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}@${POSTGRES_HOST}:${POSTGRES_PORT}/${POSTGRES_DB}}\" --artifacts-destination \"$MLFLOW_ARTIFACTS_DESTINATION\" --serve-artifacts --host 0.0.0.0 --port 5000 --workers \"$MLFLOW_WORKERS\" \"$@\"", "mlflow-server"]
