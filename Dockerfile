# The application image used by docker-compose.yml for both consumer sites, the gateway and
# Airflow's workers: the same locked environment as `make env`, plus the Maven jars.
# PYTHON_IMAGE: the official image by default; `settle stack up` builds on a machine without a
# registry with Debian's Python instead (deploy/local/python.Dockerfile).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE} AS base
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
RUN pip install --no-cache-dir uv==0.13.8
# The interpreter is the image's; uv must never fetch another.
ENV UV_PYTHON_DOWNLOADS=never
# Dependencies first, then the jars, then the project: a source change rebuilds only the
# last layer (seconds), not the 1 GB environment.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project --compile-bytecode
# Only what Maven reads: a change to the classifier's source (built by `make setup`, not here)
# must not fetch the jars again.
COPY jvm/settings.xml jvm/settings.xml
COPY jvm/kafka/pom.xml jvm/kafka/pom.xml
COPY jvm/spark/pom.xml jvm/spark/pom.xml
RUN mvn -s jvm/settings.xml -q -B -f jvm/kafka/pom.xml package \
 && mvn -s jvm/settings.xml -q -B -f jvm/spark/pom.xml package
COPY settlement settlement
COPY consumers consumers
COPY dags dags
COPY sql sql
COPY gx gx
RUN uv sync --frozen --no-dev --compile-bytecode
ENV PATH="/app/.venv/bin:${PATH}" \
    SPARK_LOCAL_IP=0.0.0.0 \
    GX_ANALYTICS_ENABLED=false
# Never root at run time; the code and environment stay root's (read-only to the services).
# /app/airflow (AIRFLOW_HOME) and its logs, and /app/reports exist in the image so that the
# named volumes docker-compose.yml mounts there start owned by settle; GX writes its results
# into its project folder (/app/gx), and state goes to /app/.state.
RUN mkdir -p /app/airflow/logs /app/reports /app/.state \
 && useradd --system --uid 10001 settle \
 && chown -R settle /app/airflow /app/reports /app/.state /app/gx
ENV AIRFLOW_HOME=/app/airflow
USER settle
ENTRYPOINT ["settle"]
