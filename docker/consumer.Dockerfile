# spanner-cdc consumer: PySpark needs a Java 17 runtime beside Python.
FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY spanner_cdc spanner_cdc
RUN pip install --no-cache-dir '.[consumer]' \
    && python -m spanner_cdc.consumer.pyspark_bytecode \
    && useradd --system --uid 10001 --create-home cdc \
    && mkdir -p /data /checkpoints && chown cdc /data /checkpoints
USER cdc
ENV PYSPARK_PYTHON=python
CMD ["spanner-cdc", "consume"]
