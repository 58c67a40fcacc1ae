# PostgreSQL for the team tracking server, from Debian's package: builds where the official `postgres` image
# cannot be pulled (on the local base of scripts/docker_base.sh) and anywhere else on python:3.11-slim or any
# Debian bookworm image. Same interface as the official image: POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB,
# data in /var/lib/postgresql/data, initialised on the first start. Configured by docker/compose.yaml.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# The Debian package would create and start its own 'main' cluster: it is told not to (the entrypoint makes one).
RUN set -e; apt-get update; \
    apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold postgresql-common; \
    sed -ri 's/^#?\s*create_main_cluster\s*=.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf; \
    apt-get install -y --no-install-recommends postgresql; \
    rm -rf /var/lib/apt/lists/*; \
    ln -s "$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)" /usr/local/lib/postgresql-bin; \
    mkdir -p /var/lib/postgresql/data /var/run/postgresql; \
    chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql; chmod 700 /var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/local/lib/postgresql-bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
# SIGINT is PostgreSQL's fast shutdown: `docker stop` / `restart` end it cleanly, even with MLflow connected
# (SIGTERM, a smart shutdown, would wait for the clients until Docker kills it).
STOPSIGNAL SIGINT
HEALTHCHECK --interval=5s --timeout=5s --retries=20 CMD pg_isready -h 127.0.0.1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -q
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
