# The application image used by docker-compose.yml for both consumer sites, the gateway and
# Airflow's workers: the same locked environment as `make env`, plus the Maven jars.
FROM python:3.11.11-slim-bookworm AS base
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
RUN pip install --no-cache-dir uv==0.13.8
COPY pyproject.toml uv.lock README.md ./
COPY settlement settlement
COPY consumers consumers
COPY dags dags
COPY sql sql
COPY gx gx
COPY jvm jvm
RUN uv sync --frozen --no-dev --compile-bytecode \
 && mvn -s jvm/settings.xml -q -B -f jvm/kafka/pom.xml package \
 && mvn -s jvm/settings.xml -q -B -f jvm/spark/pom.xml package
ENV PATH="/app/.venv/bin:${PATH}" \
    SPARK_LOCAL_IP=0.0.0.0 \
    GX_ANALYTICS_ENABLED=false
# Never root at run time. /app/airflow (AIRFLOW_HOME) and its logs, and /app/reports exist in
# the image so that the named volumes docker-compose.yml mounts there start owned by settle.
RUN mkdir -p /app/airflow/logs /app/reports \
 && useradd --system --uid 10001 settle && chown -R settle /app
ENV AIRFLOW_HOME=/app/airflow
USER settle
ENTRYPOINT ["settle"]
