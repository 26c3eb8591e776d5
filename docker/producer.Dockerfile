# spanner-cdc producer (and the `spanner-cdc` CLI): Python only, no JVM. The package has compiled
# modules (spanner_cdc/**/*.pyx): a C compiler is there while pip builds them, then removed.
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY spanner_cdc spanner_cdc
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir '.[producer]' \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 cdc
USER cdc
CMD ["spanner-cdc", "produce"]
