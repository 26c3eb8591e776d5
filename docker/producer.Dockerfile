# spanner-cdc producer (and the `spanner-cdc` CLI): Python only, no JVM.
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml README.md ./
COPY spanner_cdc spanner_cdc
RUN pip install --no-cache-dir '.[producer]' && useradd --system --uid 10001 cdc
USER cdc
CMD ["spanner-cdc", "produce"]
