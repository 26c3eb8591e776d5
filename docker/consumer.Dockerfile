# spanner-cdc consumer: PySpark needs a Java 17 runtime beside Python. The package has compiled
# modules (spanner_cdc/**/*.pyx): a C compiler is there while pip builds them, then removed.
# Spark's Kafka connector comes from Maven Central by jvm/spark/pom.xml (scripts/jars.sh), into
# /usr/local/share/spanner-cdc/jars, where the consumer finds it; Maven is removed afterwards.
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY spanner_cdc spanner_cdc
COPY jvm jvm
COPY scripts/jars.sh scripts/jars.sh
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless gcc libc6-dev maven \
    && pip install --no-cache-dir '.[consumer]' \
    && bash scripts/jars.sh /usr/local/share/spanner-cdc/jars jvm/spark \
    && rm -rf /root/.m2 \
    && apt-get purge -y --auto-remove gcc libc6-dev maven \
    && rm -rf /var/lib/apt/lists/* \
    && python -m spanner_cdc.consumer.pyspark_bytecode \
    && useradd --system --uid 10001 --create-home cdc \
    && mkdir -p /data /checkpoints && chown cdc /data /checkpoints
USER cdc
ENV PYSPARK_PYTHON=python
CMD ["spanner-cdc", "consume"]
