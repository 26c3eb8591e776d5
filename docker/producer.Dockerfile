# spanner-cdc producer (and the `spanner-cdc` CLI): Python only, no JVM.
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY producer producer
COPY consumer consumer
COPY spanner_cdc spanner_cdc
RUN pip install --no-cache-dir . && useradd --system --uid 10001 cdc
USER cdc
CMD ["spanner-cdc", "produce"]
